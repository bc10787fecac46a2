package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuMeter reads the CPU time (user and system) used so far by the
// benchmark's processes: Caddy (which also serves the upstream), Redis, and
// this one, the load generator. Where a process's CPU time cannot be read
// (no /proc), it reads as -1.
type cpuMeter struct{ caddyPID, redisPID int }

// cpuTimes is what each process has used.
type cpuTimes struct{ caddy, redis, load time.Duration }

func (m cpuMeter) read() cpuTimes {
	return cpuTimes{caddy: processCPU(m.caddyPID), redis: processCPU(m.redisPID), load: selfCPU()}
}

// perRequest divides what each process used between then and now by the
// requests served.
func (now cpuTimes) perRequest(then cpuTimes, requests int64) cpuTimes {
	per := func(a, b time.Duration) time.Duration {
		if a < 0 || b < 0 || requests == 0 {
			return -1
		}
		return (a - b) / time.Duration(requests)
	}
	return cpuTimes{caddy: per(now.caddy, then.caddy), redis: per(now.redis, then.redis), load: per(now.load, then.load)}
}

// userHZ is the unit of /proc/<pid>/stat's times, 100 on every Linux.
const userHZ = 100

// processCPU is utime+stime of /proc/<pid>/stat, fields 14 and 15 (after
// the parenthesised command name, which may hold spaces).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return -1
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	return time.Duration(utime+stime) * time.Second / userHZ
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return -1
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// micros prints a per-request CPU time.
func micros(d time.Duration) string {
	if d < 0 {
		return "-"
	}
	return strconv.FormatInt(d.Microseconds(), 10)
}
