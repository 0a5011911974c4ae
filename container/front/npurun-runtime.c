/*
 * npurun-runtime: the OCI runtime a container engine runs (Docker's runtime
 * "npurun", see npurun-runtime(8)), in front of runc.
 *
 * An engine calls its runtime for every step of a container's life: create,
 * start, state, kill, delete, exec, ... Only create (and run) concern the
 * lease; for those this program becomes npurun-runtime-create, the Go
 * program beside it (package ociruntime), with the command line as it came.
 * Every other command goes to runc at once by execv, without npurun's own
 * options: a Go program's start on each of them cost some 4 ms (a few per
 * container), this one's a fraction of one.
 *
 * It reads its command line only: npurun's options (--npurun-config,
 * --npurun-socket, --npurun-runc, with their values), runc's global options
 * (those that take a value: --log, --log-format, --root, --criu,
 * --rootless), then the command. It runs as the engine's runtime does
 * (root, or a rootless engine's user), and trusts nothing else: runc is
 * --npurun-runc, else the first runc in PATH, /usr/sbin, /usr/bin.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const own[] = {"--npurun-config", "--npurun-socket", "--npurun-runc", NULL};
static const char *const runc_values[] = {"--log", "--log-format", "--root", "--criu", "--rootless", NULL};

/* named returns the value of option at argv[*i] if its name is name
 * ("--name VALUE" or "--name=VALUE"), advancing *i past a separate value;
 * NULL (and *i as it was) otherwise. */
static const char *named(char **argv, int argc, int *i, const char *name) {
	size_t n = strlen(name);
	const char *a = argv[*i];
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] != '\0')
		return NULL;
	if (*i + 1 >= argc)
		return "";
	(*i)++;
	return argv[*i];
}

/* takes tells whether option a (a name, or name=value) is one of names. */
static int takes(const char *a, const char *const *names) {
	for (; *names; names++) {
		size_t n = strlen(*names);
		if (strncmp(a, *names, n) == 0 && (a[n] == '\0' || a[n] == '='))
			return a[n] == '\0' ? 2 : 1;
	}
	return 0;
}

static const char *log_path, *log_format;

/* fail says why where the engine reads it: the runtime's log (--log, in
 * --log-format: runc's JSON), else standard error; and returns 1. */
static int fail(const char *what, const char *path) {
	char msg[PATH_MAX + 256];
	snprintf(msg, sizeof msg, "npurun-runtime: %s %s: %s", what, path, strerror(errno));
	if (log_path && *log_path) {
		int fd = open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0) {
			char line[2 * sizeof msg + 128];
			size_t k = 0;
			const char *pre = log_format && strcmp(log_format, "json") == 0 ? "{\"level\":\"error\",\"msg\":\"" : "level=error msg=\"";
			k += (size_t)snprintf(line, sizeof line, "%s", pre);
			for (const char *c = msg; *c && k + 8 < sizeof line; c++) {
				unsigned char u = (unsigned char)*c;
				if (u == '"' || u == '\\') {
					line[k++] = '\\';
					line[k++] = (char)u;
				} else if (u < 0x20) {
					k += (size_t)snprintf(line + k, sizeof line - k, "\\u%04x", u);
				} else {
					line[k++] = (char)u;
				}
			}
			k += (size_t)snprintf(line + k, sizeof line - k, "\"%s\n", pre[0] == '{' ? "}" : "");
			if (write(fd, line, k) < 0) {
				/* nowhere else to say it */
			}
			close(fd);
			return 1;
		}
	}
	fprintf(stderr, "%s\n", msg);
	return 1;
}

/* find_runc looks for an executable runc in PATH, then /usr/sbin and
 * /usr/bin, into buf. */
static const char *find_runc(char *buf, size_t size) {
	const char *path = getenv("PATH");
	char dirs[8192];
	snprintf(dirs, sizeof dirs, "%s:/usr/sbin:/usr/bin", path ? path : "");
	for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		if (*d == '\0')
			continue;
		if ((size_t)snprintf(buf, size, "%s/runc", d) >= size)
			continue;
		if (access(buf, X_OK) == 0)
			return buf;
	}
	return "/usr/sbin/runc";
}

int main(int argc, char **argv) {
	const char *runc = NULL;
	int i = 1;
	/* npurun's options and runc's global ones, up to the command. */
	while (i < argc && argv[i][0] == '-') {
		/* named and takes leave i at the option's last word. */
		const char *v;
		if ((v = named(argv, argc, &i, "--npurun-runc")) != NULL)
			runc = v;
		else if ((v = named(argv, argc, &i, "--log")) != NULL)
			log_path = v;
		else if ((v = named(argv, argc, &i, "--log-format")) != NULL)
			log_format = v;
		else if (takes(argv[i], own) == 2 || takes(argv[i], runc_values) == 2)
			i++;
		i++;
	}
	const char *cmd = i < argc ? argv[i] : "";
	if (strcmp(cmd, "create") == 0 || strcmp(cmd, "run") == 0) {
		/* npurun-runtime-create, beside this program. */
		char self[PATH_MAX], create[PATH_MAX + 32];
		ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
		if (n <= 0)
			return fail("find myself at", "/proc/self/exe");
		self[n] = '\0';
		char *slash = strrchr(self, '/');
		if (!slash)
			return fail("find myself at", self);
		*slash = '\0';
		snprintf(create, sizeof create, "%s/npurun-runtime-create", self);
		argv[0] = create;
		execv(create, argv);
		return fail("run", create);
	}
	/* Every other command: runc, without npurun's options. */
	char found[PATH_MAX];
	if (!runc || !*runc)
		runc = find_runc(found, sizeof found);
	char **out = calloc((size_t)argc + 1, sizeof *out);
	if (!out)
		return fail("allocate for", runc);
	int n = 0;
	out[n++] = (char *)runc;
	for (int k = 1; k < argc; k++) {
		if (k < i) {
			int t = takes(argv[k], own);
			if (t) {
				k += t - 1;
				continue;
			}
		}
		out[n++] = argv[k];
	}
	out[n] = NULL;
	execv(runc, out);
	return fail("run", runc);
}
