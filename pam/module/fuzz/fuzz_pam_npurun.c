/*
 * libFuzzer harness for pam_npurun.c (make fuzz-pam; not part of make test).
 *
 * It includes the module's source (and with it c/npurun_wire.c, the wire
 * code the module shares with spank_npurun.c), so that its static functions are
 * reachable, and stands in for libpam with the stubs below, which check
 * what the module hands to PAM. The first input byte picks what is fuzzed:
 *
 *   0  the strict reader alone: the rest is one reply
 *   1  the whole receive path: the rest is packets, each [nfds][len lo][len
 *      hi][bytes] (length 0xffff: the rest of the input, which may be more
 *      than the module takes), sent with nfds descriptors (up to 79: more
 *      than the module takes) over a SOCK_SEQPACKET socket pair; the module reads
 *      them as it reads the broker, carries out the answer (lease mode when
 *      bit 7 of the first byte is set) and the handle ends. Afterwards no
 *      descriptor of the module's may be open.
 *   2  the request builder: the rest is user, service, tty and rhost,
 *      separated by NUL bytes; the request must be valid UTF-8 whose strings
 *      decode within the broker's caps, the user's name exactly.
 *
 * Everything the module puts (pam_putenv) must be a variable of the
 * broker's or NPURUN_LEASE; every message shown must be free of control
 * characters.
 */
#include "../pam_npurun.c"

#include <dirent.h>

static char handle_byte;
#define PAMH ((pam_handle_t *)&handle_byte)

/* ---- libpam, as far as the module uses it ---- */

static void *data_ptr;
static void (*data_cleanup)(pam_handle_t *, void *, int);
static int data_set;

int pam_get_item(const pam_handle_t *pamh, int item_type, const void **item)
{
	(void)pamh;
	switch (item_type) {
	case PAM_SERVICE:
		*item = "fuzz";
		return PAM_SUCCESS;
	case PAM_TTY:
		*item = "pts/0";
		return PAM_SUCCESS;
	default:
		*item = NULL;
		return PAM_SUCCESS;
	}
}

const char *pam_strerror(pam_handle_t *pamh, int errnum)
{
	(void)pamh;
	(void)errnum;
	return "error";
}

int pam_putenv(pam_handle_t *pamh, const char *nv)
{
	(void)pamh;
	if (strncmp(nv, "NPURUN_LEASE=", 13) != 0 && !valid_env(nv))
		abort(); /* the module put a variable the broker may not set */
	return PAM_SUCCESS;
}

int pam_get_user(pam_handle_t *pamh, const char **user, const char *prompt)
{
	(void)pamh;
	(void)prompt;
	*user = "fuzzer";
	return PAM_SUCCESS;
}

int pam_set_data(pam_handle_t *pamh, const char *name, void *data, void (*cleanup)(pam_handle_t *, void *, int))
{
	(void)name;
	if (data_set && data_cleanup != NULL)
		data_cleanup(pamh, data_ptr, PAM_DATA_REPLACE);
	data_ptr = data;
	data_cleanup = cleanup;
	data_set = 1;
	return PAM_SUCCESS;
}

int pam_get_data(const pam_handle_t *pamh, const char *name, const void **data)
{
	(void)pamh;
	(void)name;
	if (!data_set)
		return PAM_NO_MODULE_DATA;
	*data = data_ptr;
	return PAM_SUCCESS;
}

static void end_handle(void)
{
	if (data_set && data_cleanup != NULL)
		data_cleanup(PAMH, data_ptr, PAM_SUCCESS);
	data_ptr = NULL;
	data_cleanup = NULL;
	data_set = 0;
}

void pam_syslog(const pam_handle_t *pamh, int priority, const char *fmt, ...)
{
	char buf[8192];
	va_list ap;
	(void)pamh;
	(void)priority;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
}

int pam_prompt(pam_handle_t *pamh, int style, char **response, const char *fmt, ...)
{
	char buf[2 * MAX_STRING];
	va_list ap;
	(void)pamh;
	(void)style;
	if (response != NULL)
		*response = NULL;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	for (const unsigned char *p = (const unsigned char *)buf; *p != '\0'; p++)
		if (*p < 0x20 || *p == 0x7f || (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f))
			abort(); /* a control character reached the user's terminal */
	return PAM_SUCCESS;
}

/* ---- the targets ---- */

static int dev_null = -1;
static unsigned char open_at_start[1024];

static void mark_open(unsigned char *set)
{
	for (int fd = 0; fd < 1024; fd++)
		set[fd] = fcntl(fd, F_GETFD) >= 0;
}

static void fuzz_parse(const uint8_t *data, size_t len)
{
	struct reply *rp = calloc(1, sizeof *rp);
	if (npurun_parse_reply(data, len, rp) == 0) {
		if (strlen(rp->type) >= sizeof rp->type || rp->nenv > MAX_ENV || rp->ndevices > MAX_DEVICES)
			abort();
		for (int i = 0; i < rp->nenv; i++)
			if (!valid_env(rp->env[i]))
				abort();
	}
	free_reply(rp);
	free(rp);
}

static void fuzz_receive(const uint8_t *data, size_t len, int lease)
{
	int sv[2];
	struct options o = {.socket = "/fuzz/broker.sock", .timeout_ms = 50, .lease = lease, .debug = 1};
	struct reply *rp;
	unsigned char now_open[1024];

	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
		abort();
	while (len >= 3) {
		int nfds = data[0] % 80, fds[80];
		size_t k = (size_t)data[1] | (size_t)data[2] << 8;
		struct iovec iov;
		struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int) * 80)];
		} ctl;
		data += 3;
		len -= 3;
		if (k > len || k == 0xffff)
			k = len; /* 0xffff: the rest, which may be larger than the module takes */
		iov.iov_base = (void *)data;
		iov.iov_len = k;
		if (nfds > 0) {
			for (int i = 0; i < nfds; i++)
				fds[i] = dev_null;
			memset(&ctl, 0, sizeof ctl);
			m.msg_control = ctl.b;
			m.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)nfds);
			CMSG_FIRSTHDR(&m)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&m)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&m)->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)nfds);
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&m)), fds, sizeof(int) * (size_t)nfds);
		}
		if (sendmsg(sv[1], &m, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
			break; /* the socket's buffer is full: enough */
		data += k;
		len -= k;
	}
	close(sv[1]); /* what was sent stays readable, then end of file */
	rp = calloc(1, sizeof *rp);
	if (receive(PAMH, &o, sv[0], now_ms() + o.timeout_ms, rp) == 0) {
		if (strcmp(rp->type, "queued") == 0)
			abort();
		if (strcmp(rp->type, "grant") == 0 && (rp->nfds != rp->ndevices || rp->nfds == 0))
			abort();
		obey(PAMH, &o, "fuzzer", rp);
		pam_sm_close_session(PAMH, 0, 0, NULL);
	} else if (rp->nfds != 0 || rp->nenv != 0) {
		abort(); /* a failed answer keeps nothing */
	}
	end_handle();
	free(rp);
	close(sv[0]);
	mark_open(now_open);
	if (memcmp(now_open, open_at_start, sizeof now_open) != 0)
		abort(); /* a descriptor left open */
}

static void fuzz_request(const uint8_t *data, size_t len)
{
	char *s = malloc(len + 1), *f[4] = {"", "", "", ""}, req[MAX_REQUEST];
	char user[MAX_USER + 1], service[MAX_SERVICE + 1], tty[MAX_TTY + 1], rhost[MAX_RHOST + 1];
	size_t n = 0, nf = 0;
	memcpy(s, data, len);
	s[len] = '\0';
	for (char *p = s; nf < 4; nf++) {
		f[nf] = p;
		p += strlen(p);
		if (p == s + len)
			break;
		p++;
	}
	if (build_request(req, sizeof req, &n, f[0], f[1], f[2], f[3], 1) == 0) {
		struct reader r = {(const unsigned char *)req, (const unsigned char *)req + n};
		long long v;
		if (n >= sizeof req || req[n] != '\0' || strlen(req) != n || !valid_utf8(req))
			abort();
		/* The broker's view: each string decodes within its cap. */
		if (expect(&r, '{') != 0 || read_string(&r, user, 8) != 0 || expect(&r, ':') != 0 ||
		    read_int(&r, &v) != 0 || expect(&r, ',') != 0 ||
		    read_string(&r, user, 8) != 0 || expect(&r, ':') != 0 || read_string(&r, user, 16) != 0 ||
		    expect(&r, ',') != 0 || read_string(&r, user, 8) != 0 || expect(&r, ':') != 0 ||
		    read_string(&r, user, sizeof user) != 0 || strcmp(user, f[0]) != 0 ||
		    expect(&r, ',') != 0 || read_string(&r, service, 16) != 0 || expect(&r, ':') != 0 ||
		    read_string(&r, service, sizeof service) != 0 ||
		    expect(&r, ',') != 0 || read_string(&r, tty, 16) != 0 || expect(&r, ':') != 0 ||
		    read_string(&r, tty, sizeof tty) != 0 ||
		    expect(&r, ',') != 0 || read_string(&r, rhost, 16) != 0 || expect(&r, ':') != 0 ||
		    read_string(&r, rhost, sizeof rhost) != 0)
			abort();
	} else if (strlen(f[0]) <= MAX_USER && valid_utf8(f[0])) {
		abort(); /* a name that fits was refused */
	}
	free(s);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	dev_null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	mark_open(open_at_start);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t len)
{
	if (len == 0)
		return 0;
	switch (data[0] & 3) {
	case 0:
		fuzz_parse(data + 1, len - 1);
		break;
	case 1:
		fuzz_receive(data + 1, len - 1, (data[0] & 0x80) != 0);
		break;
	case 2:
		fuzz_request(data + 1, len - 1);
		break;
	}
	return 0;
}
