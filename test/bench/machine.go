package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// machineCPU is the machine's CPU time so far, in seconds, from the first line of
// /proc/stat: busy (user, nice, system, irq, softirq), idle (idle and iowait) and
// stolen (time the hypervisor gave this VM's CPUs to someone else). The bench reads it
// around each converge: how busy the machine was, and whether the VM was short of CPU
// for reasons outside it, which makes runs of one build differ.
type machineCPU struct {
	busy, idle, steal float64
}

// clockTicks is USER_HZ, the unit of /proc/stat: 100 on every Linux the bench runs on.
const clockTicks = 100

func readMachineCPU() (machineCPU, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machineCPU{}, err
	}
	return parseMachineCPU(string(data))
}

func parseMachineCPU(stat string) (machineCPU, error) {
	line, _, _ := strings.Cut(stat, "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return machineCPU{}, fmt.Errorf("/proc/stat: the first line is not the machine's cpu line: %q", line)
	}
	var v [8]float64 // user nice system idle iowait irq softirq steal
	for i := range v {
		n, err := strconv.ParseUint(fields[i+1], 10, 64)
		if err != nil {
			return machineCPU{}, fmt.Errorf("/proc/stat: field %d of the cpu line: %w", i+1, err)
		}
		v[i] = float64(n) / clockTicks
	}
	return machineCPU{busy: v[0] + v[1] + v[2] + v[5] + v[6], idle: v[3] + v[4], steal: v[7]}, nil
}

func (m machineCPU) minus(o machineCPU) machineCPU {
	return machineCPU{busy: m.busy - o.busy, idle: m.idle - o.idle, steal: m.steal - o.steal}
}
