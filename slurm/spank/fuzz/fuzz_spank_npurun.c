/*
 * Fuzz harness for spank_npurun.c (make fuzz-spank, with libFuzzer; not
 * part of make test). It includes the plugin's source (and with it
 * c/npurun_wire.c, the wire code it shares with pam_npurun.c), so that its static
 * functions are reachable, and stands in for slurmstepd's SPANK functions.
 * The first input byte picks what is fuzzed:
 *
 *   0  the strict reader alone: the rest is one reply; what it accepts
 *      must be within its caps, every variable one of the broker's
 *   1  a task's whole path: the rest is one reply, sent with 0 to 3 open
 *      descriptors (the second byte, mod 4) over a SOCK_SEQPACKET pair as
 *      the broker's answer to slurm-task; the plugin places what it keeps
 *      and sets the variables (task_init); afterwards every descriptor it
 *      placed is at 20 or above, close-on-exec clear, every variable set
 *      is the broker's or NPURUN_LEASE, and no other descriptor is left
 *
 * Built without -fsanitize=fuzzer and with -DSTANDALONE, main() runs the
 * seeds given as files, then mutations of them, under ASan and UBSan.
 */
#include "../spank_npurun.c"

#include <dirent.h>
#include <stdarg.h>

/* ---- slurmstepd, as far as the plugin uses it ---- */

void slurm_error(const char *fmt, ...) { (void)fmt; }
void slurm_info(const char *fmt, ...) { (void)fmt; }

spank_context_t spank_context(void) { return S_CTX_REMOTE; }

spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...)
{
	va_list ap;
	(void)sp;
	va_start(ap, item);
	switch (item) {
	case S_JOB_ID:
		*va_arg(ap, uint32_t *) = 42;
		break;
	case S_JOB_UID:
		*va_arg(ap, uid_t *) = 1001;
		break;
	case S_JOB_STEPID:
		*va_arg(ap, uint32_t *) = 0;
		break;
	default:
		va_end(ap);
		return ESPANK_BAD_ARG;
	}
	va_end(ap);
	return ESPANK_SUCCESS;
}

static int nset;
spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int overwrite)
{
	char buf[MAX_STRING * 2];
	(void)sp;
	(void)overwrite;
	snprintf(buf, sizeof buf, "%s=%s", var, val);
	if (strcmp(var, "NPURUN_LEASE") != 0 && !valid_env(buf))
		abort(); /* a variable the broker may not set */
	nset++;
	return ESPANK_SUCCESS;
}

static int open_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	if (d == NULL)
		abort();
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n - 1; /* the directory's own */
}

static void task_path(const uint8_t *data, size_t size)
{
	int sv[2], fds[3], nfds, before;
	struct options o = {.socket = "fuzz", .timeout_ms = 1};
	struct reply *rp;
	char why[512];
	if (size < 1)
		return;
	nfds = data[0] % 4;
	before = open_fds();
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	for (int i = 0; i < nfds; i++)
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
	{
		struct iovec iov = {.iov_base = (void *)(data + 1), .iov_len = size - 1};
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * 3)];
		} ctl;
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
		if (nfds > 0) {
			m.msg_control = ctl.b;
			m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
			CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), fds, sizeof(int) * (size_t)nfds);
		}
		if (size - 1 > 0 && sendmsg(sv[1], &m, 0) < 0 && errno != EMSGSIZE)
			abort();
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	rp = calloc(1, sizeof *rp);
	fcntl(sv[0], F_SETFL, O_NONBLOCK);
	/* The plugin's own path: the request goes (the pair has room), the
	 * answer is read, what is kept is placed, the variables are set. */
	if (ask_on(&o, sv[0], now_ms() + o.timeout_ms, "{}", rp, why, sizeof why) == 0) {
		take_task_lease(42, rp);
		if (task.ready) {
			const char *l = strchr(task.env[task.nenv - 1], '=') + 1;
			slurm_spank_task_init(NULL, 0, NULL);
			while (*l != '\0') {
				int fd = atoi(strchr(l, ':') + 1);
				if (fd < FIRST_LEASE_FD || (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0)
					abort();
				close(fd);
				l = strchr(l, ',') ? strchr(l, ',') + 1 : l + strlen(l);
			}
		}
		for (int i = 0; i < task.nenv; i++)
			free(task.env[i]);
		task.nenv = 0;
		task.ready = 0;
		close_fds(rp->fds, rp->nfds);
		rp->nfds = 0;
	}
	free_reply(rp);
	free(rp);
	close(sv[0]);
	close(sv[1]);
	if (open_fds() != before) /* nothing of the answer's left open */
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct reply rp;
	if (size < 1)
		return 0;
	switch (data[0] % 2) {
	case 0:
		memset(&rp, 0, sizeof rp);
		if (npurun_parse_reply(data + 1, size - 1, &rp) == 0) {
			if (rp.ndevices > MAX_DEVICES || rp.nenv > MAX_ENV)
				abort();
			for (int i = 0; i < rp.nenv; i++)
				if (!valid_env(rp.env[i]))
					abort();
			free_reply(&rp);
		}
		break;
	case 1:
		task_path(data + 1, size - 1);
		break;
	}
	return 0;
}

#ifdef STANDALONE
#include <sys/stat.h>
int main(int argc, char **argv)
{
	static uint8_t seeds[64][4096];
	static size_t lens[64];
	int ns = 0;
	long iters = argc > 1 ? atol(argv[1]) : 100000;
	for (int i = 2; i < argc && ns < 64; i++) {
		FILE *f = fopen(argv[i], "rb");
		if (f == NULL)
			continue;
		lens[ns] = fread(seeds[ns], 1, sizeof seeds[ns], f);
		fclose(f);
		LLVMFuzzerTestOneInput(seeds[ns], lens[ns]);
		ns++;
	}
	srand(1);
	for (long k = 0; k < iters && ns > 0; k++) {
		uint8_t buf[4096];
		int s = rand() % ns;
		size_t len = lens[s];
		memcpy(buf, seeds[s], len);
		for (int m = rand() % 8; m >= 0 && len > 0; m--) {
			switch (rand() % 4) {
			case 0: buf[rand() % len] = (uint8_t)rand(); break;
			case 1: if (len > 1) len = (size_t)(rand() % (int)len) + 1; break;
			case 2: buf[rand() % len] ^= (uint8_t)(1u << (rand() % 8)); break;
			case 3: if (len < sizeof buf) buf[len++] = (uint8_t)"{}[]\",:\\0123456789aeflnrstuv"[rand() % 28]; break;
			}
		}
		LLVMFuzzerTestOneInput(buf, len);
	}
	printf("%ld inputs from %d seeds: no crash\n", iters, ns);
	return 0;
}
#endif
