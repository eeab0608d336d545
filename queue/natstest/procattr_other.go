//go:build !linux

package natstest

import "syscall"

func procAttr() *syscall.SysProcAttr { return nil }
