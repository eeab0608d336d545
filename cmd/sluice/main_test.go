package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestDispatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string // a substring; "" means stdout must be empty
		stderr string // a substring; "" means stderr must be empty
	}{
		{name: "no command", args: nil, code: exitUsage, stderr: "Usage:"},
		{name: "unknown command", args: []string{"serv"}, code: exitUsage, stderr: `unknown command "serv"`},
		{name: "help", args: []string{"help"}, code: exitOK, stdout: "simulate"},
		{name: "--help", args: []string{"--help"}, code: exitOK, stdout: "Commands:"},
		{name: "help simulate", args: []string{"help", "simulate"}, code: exitOK, stdout: "Usage: sluice simulate"},
		{name: "simulate -h", args: []string{"simulate", "-h"}, code: exitOK, stdout: "-refill-rate"},
		{name: "help unknown", args: []string{"help", "nope"}, code: exitUsage, stderr: `unknown command "nope"`},
		{name: "version", args: []string{"version"}, code: exitOK, stdout: "sluice "},
		{name: "version argument", args: []string{"version", "x"}, code: exitUsage, stderr: `unexpected argument "x"`},
		{name: "bad flag", args: []string{"version", "--nope"}, code: exitUsage, stderr: "Run 'sluice version -h'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			check := func(stream, got, want string) {
				if want == "" && got != "" {
					t.Errorf("%s not empty: %q", stream, got)
				}
				if !strings.Contains(got, want) {
					t.Errorf("%s %q does not contain %q", stream, got, want)
				}
			}
			check("stdout", out.String(), tc.stdout)
			check("stderr", errb.String(), tc.stderr)
		})
	}
}

func TestApplyEnv(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	redis := fs.String("redis", "", "")
	size := fs.Int("bucket-size", 0, "")
	window := fs.Duration("window", 0, "")
	verbose := fs.Bool("verbose", false, "")
	plain := fs.String("plain", "default", "")
	if err := fs.Parse([]string{"--window", "2s"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{
		"SLUICE_REDIS":       "redis://r:6379/0",
		"SLUICE_BUCKET_SIZE": "7",
		"SLUICE_WINDOW":      "9s", // the flag was given: it wins
		"SLUICE_VERBOSE":     "true",
	}
	set, err := applyEnv(fs, func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatal(err)
	}
	if *redis != "redis://r:6379/0" || *size != 7 || *window != 2*time.Second || !*verbose || *plain != "default" {
		t.Errorf("got redis=%q size=%d window=%v verbose=%v plain=%q", *redis, *size, *window, *verbose, *plain)
	}
	if !set["redis"] || !set["bucket-size"] || set["window"] || set["plain"] {
		t.Errorf("set from the environment: %v", set)
	}

	fs = pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.Int("limit", 0, "")
	_ = fs.Parse(nil)
	_, err = applyEnv(fs, func(k string) (string, bool) { return "lots", k == "SLUICE_LIMIT" })
	if err == nil || !strings.Contains(err.Error(), "SLUICE_LIMIT (for --limit)") {
		t.Errorf("bad value: %v", err)
	}
}
