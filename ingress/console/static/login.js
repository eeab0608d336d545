"use strict";
if (new URLSearchParams(location.search).has("failed")) {
  document.getElementById("failed").hidden = false;
}
// A one-time sign-in code (sluice prints /console/#code=… at start): post it, and take
// it off the address bar and the history first.
const code = /^#code=([0-9a-f]{32})$/.exec(location.hash);
if (code) {
  history.replaceState(null, "", location.pathname + location.search);
  const form = document.getElementById("login");
  const field = document.createElement("input");
  field.type = "hidden";
  field.name = "code";
  field.value = code[1];
  form.appendChild(field);
  document.getElementById("token").required = false;
  form.submit();
}
