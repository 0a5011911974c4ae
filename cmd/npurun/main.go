// Command npurun runs a command on accelerator devices leased from npubroker.
package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/spf13/pflag"

	"github.com/npurun/npurun/npu"
	"github.com/npurun/npurun/shim"
)

var version = "dev"

const usage = `Usage:
  npurun [-n N | -d LIST] [-p POOL] [--no-wait] [--timeout DURATION] [-v | -q] [--socket PATH] [--] COMMAND [ARG...]
  npurun --no-device [--] COMMAND [ARG...]
  npurun --login [-q] [--socket PATH]

Wait for free accelerator devices, lease them from npubroker, set
NPURUN_DEVICES and the vendor's visible-device variable, and become COMMAND.
The lease lasts until COMMAND and every process it started have exited.

Options:
`

func main() {
	var o shim.Options
	fs := pflag.NewFlagSet("npurun", pflag.ContinueOnError)
	fs.SetInterspersed(false)
	fs.Usage = func() {
		fmt.Fprint(os.Stderr, usage)
		fs.PrintDefaults()
	}
	fs.IntVarP(&o.N, "devices", "n", 0, "number of devices (default 1)")
	var devices []string
	fs.StringArrayVarP(&devices, "device", "d", nil, "exactly these devices: a `LIST` of physical ids and ranges, such as 3 or 0-3,8; waits for them alone (may be repeated)")
	fs.StringVarP(&o.Pool, "pool", "p", "", "pool to take devices from (default: the policy's default pool)")
	fs.BoolVar(&o.NoWait, "no-wait", false, "fail at once with status 75 if nothing is free")
	fs.DurationVar(&o.Timeout, "timeout", 0, "give up after this long (e.g. 10m), with status 75")
	fs.BoolVar(&o.NoDevice, "no-device", false, "run without a lease, with every device hidden")
	fs.BoolVar(&o.Login, "login", false, "become the login shell under the login lease (sshd's ForceCommand for restricted accounts; see pam_npurun(8))")
	fs.BoolVarP(&o.Verbose, "verbose", "v", false, "report queue progress even when standard error is not a terminal")
	fs.BoolVarP(&o.Quiet, "quiet", "q", false, "report nothing while waiting")
	fs.StringVar(&o.Socket, "socket", "", "broker socket (default $NPURUN_SOCKET or /run/npurun/broker.sock)")
	showVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == pflag.ErrHelp {
			os.Exit(0)
		}
		fmt.Fprintf(os.Stderr, "npurun: %v\n", err)
		os.Exit(shim.ExitUsage)
	}
	if *showVersion {
		fmt.Println("npurun", version)
		return
	}
	for _, d := range devices {
		ids, err := npu.ParseIDs(d)
		if err != nil {
			fmt.Fprintf(os.Stderr, "npurun: bad device list %q: %v\n", d, err)
			fmt.Fprintln(os.Stderr, "npurun: hint: -d takes physical ids and ranges, such as -d 3 or -d 0-3,8")
			os.Exit(shim.ExitUsage)
		}
		o.Devices = append(o.Devices, ids...)
	}
	o.Devices = slices.Compact(slices.Sorted(slices.Values(o.Devices)))
	if o.Login {
		if fs.NArg() > 0 || o.NoDevice || fs.Changed("devices") || len(o.Devices) > 0 || o.Pool != "" || o.NoWait || o.Timeout != 0 || o.Verbose {
			fmt.Fprintln(os.Stderr, "npurun: --login takes no command and no other option but -q and --socket")
			fmt.Fprintln(os.Stderr, "npurun: hint: the policy's [restrict] says what a login gets; sshd passes a command in SSH_ORIGINAL_COMMAND")
			os.Exit(shim.ExitUsage)
		}
		os.Exit(shim.Login(o))
	}
	switch {
	case fs.NArg() == 0:
		fmt.Fprintln(os.Stderr, "npurun: no command given")
		fmt.Fprintln(os.Stderr, "npurun: hint: npurun python train.py")
		os.Exit(shim.ExitUsage)
	case o.NoDevice && (fs.Changed("devices") || len(o.Devices) > 0 || o.Pool != ""):
		fmt.Fprintln(os.Stderr, "npurun: --no-device takes no device, count or pool")
		os.Exit(shim.ExitUsage)
	case o.N < 0 || (o.N == 0 && fs.Changed("devices")):
		fmt.Fprintf(os.Stderr, "npurun: bad device count %d: -n takes 1 or more\n", o.N)
		if o.N == 0 {
			fmt.Fprintln(os.Stderr, "npurun: hint: to run without a device, use --no-device")
		}
		os.Exit(shim.ExitUsage)
	case len(o.Devices) > 0 && o.Pool != "":
		fmt.Fprintln(os.Stderr, "npurun: --device and --pool exclude each other")
		os.Exit(shim.ExitUsage)
	case len(o.Devices) > 0 && o.N != 0 && o.N != len(o.Devices):
		fmt.Fprintf(os.Stderr, "npurun: -n %d does not match the %d devices named\n", o.N, len(o.Devices))
		os.Exit(shim.ExitUsage)
	case o.Timeout < 0 || (o.Timeout > 0 && o.NoWait):
		fmt.Fprintln(os.Stderr, "npurun: --timeout takes a positive duration and excludes --no-wait")
		os.Exit(shim.ExitUsage)
	}
	os.Exit(shim.Run(o, fs.Args()))
}
