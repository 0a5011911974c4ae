module github.com/npurun/npurun

go 1.26.8

require (
	github.com/BurntSushi/toml v1.6.0
	github.com/msteinert/pam/v2 v2.1.0
	github.com/prometheus/procfs v0.23.0
	github.com/spf13/pflag v1.1.0
	golang.org/x/sys v0.49.0
)
