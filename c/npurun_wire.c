/*
 * npurun_wire.c: the broker client's wire code in C, one copy for both of
 * npurun's C clients that run as root inside another program: pam_npurun.so
 * (in sshd, login, su: pam/module/pam_npurun.c) and spank_npurun.so (in
 * slurmstepd: slurm/spank/spank_npurun.c). Connecting to the broker (and
 * checking that root serves the socket), sending one request, receiving
 * packets with their descriptors (SCM_RIGHTS) and reading each reply with a
 * strict, bounded JSON reader all live here, once.
 *
 * How it is shared: each module #includes this file ("../../c/npurun_wire.c")
 * and all of it is static. So each .so stays one translation unit built by
 * one cc command, exporting only its PAM or SPANK entry points, and the
 * libFuzzer harnesses (pam/module/fuzz, slurm/spank/fuzz), which #include
 * their module's source, reach these functions as before, with no second
 * object to link. There is no header: nothing here is called from another
 * translation unit.
 *
 * What differs between the modules is a parameter, never a copy:
 *   WIRE_MAX_WAIT_MS  defined before the #include (the PAM module): a
 *                     reply's wait_ms must lie in 0..WIRE_MAX_WAIT_MS and
 *                     is kept; undefined (SPANK): any integer, unchecked
 *   wire_connect, wire_receive  take the words their module logs (no_room,
 *                     not_root, no_answer, self) and say what went wrong in
 *                     why, with its kind (enum wire_fail), for the module
 *                     to log as it does (pam_syslog's level, slurm_error)
 *   wire_receive's extend_ms  the PAM module moves its deadline once by an
 *                     on_busy wait the broker announces; SPANK does not (-1)
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* The Go side's values, compiled and compared by c/ctest (go test ./c/ctest):
 * change both together. FIRST_LEASE_FD: a login bash marks 3 to 19
 * close-on-exec. */
#define DEFAULT_SOCKET "/run/npurun/broker.sock"
#define PROTOCOL_VERSION 1
#define MAX_MESSAGE (64 * 1024)
#define MAX_DEVICES 64
#define FIRST_LEASE_FD 20

/* The reader's own caps. */
#define MAX_ENV 16
#define MAX_STRING 4096

/* A reply, as the strict reader accepts it. */
struct reply {
	char type[16];
	char code[32];
	char message[MAX_STRING + 1];
	char *env[MAX_ENV];
	int nenv;
	int devices[MAX_DEVICES];
	int ndevices;
	long long wait_ms;
	int fds[MAX_DEVICES];
	int nfds;
};

/* ---- the strict reader --------------------------------------------- */

struct reader {
	const unsigned char *p, *end;
};

static void skip_ws(struct reader *r)
{
	while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r'))
		r->p++;
}

static int expect(struct reader *r, unsigned char c)
{
	skip_ws(r);
	if (r->p >= r->end || *r->p != c)
		return -1;
	r->p++;
	return 0;
}

static int put_utf8(char *out, size_t cap, size_t *n, uint32_t c)
{
	unsigned char b[4];
	size_t k;
	if (c == 0 || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
		return -1;
	if (c < 0x80) {
		b[0] = (unsigned char)c;
		k = 1;
	} else if (c < 0x800) {
		b[0] = (unsigned char)(0xC0 | (c >> 6));
		b[1] = (unsigned char)(0x80 | (c & 0x3F));
		k = 2;
	} else if (c < 0x10000) {
		b[0] = (unsigned char)(0xE0 | (c >> 12));
		b[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[2] = (unsigned char)(0x80 | (c & 0x3F));
		k = 3;
	} else {
		b[0] = (unsigned char)(0xF0 | (c >> 18));
		b[1] = (unsigned char)(0x80 | ((c >> 12) & 0x3F));
		b[2] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
		b[3] = (unsigned char)(0x80 | (c & 0x3F));
		k = 4;
	}
	if (*n + k >= cap)
		return -1;
	memcpy(out + *n, b, k);
	*n += k;
	return 0;
}

static int hex4(struct reader *r, uint32_t *v)
{
	*v = 0;
	for (int i = 0; i < 4; i++) {
		unsigned char c;
		if (r->p >= r->end)
			return -1;
		c = *r->p++;
		*v <<= 4;
		if (c >= '0' && c <= '9')
			*v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			*v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			*v |= (uint32_t)(c - 'A' + 10);
		else
			return -1;
	}
	return 0;
}

/* One UTF-8 sequence from the input, validated (no overlong forms, no
 * surrogates, nothing past U+10FFFF). */
static int utf8_char(struct reader *r, uint32_t *c)
{
	const unsigned char *p = r->p;
	size_t avail = (size_t)(r->end - p), k;
	uint32_t v, min;
	if (p[0] < 0x80) {
		*c = p[0];
		r->p++;
		return 0;
	} else if ((p[0] & 0xE0) == 0xC0) {
		k = 2, v = p[0] & 0x1F, min = 0x80;
	} else if ((p[0] & 0xF0) == 0xE0) {
		k = 3, v = p[0] & 0x0F, min = 0x800;
	} else if ((p[0] & 0xF8) == 0xF0) {
		k = 4, v = p[0] & 0x07, min = 0x10000;
	} else {
		return -1;
	}
	if (avail < k)
		return -1;
	for (size_t i = 1; i < k; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return -1;
		v = (v << 6) | (p[i] & 0x3F);
	}
	if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
		return -1;
	*c = v;
	r->p += k;
	return 0;
}

/* A JSON string into out (at most cap-1 bytes and a NUL). NUL, invalid
 * UTF-8, bad escapes and raw control characters are refused. */
static int read_string(struct reader *r, char *out, size_t cap)
{
	size_t n = 0;
	if (expect(r, '"') != 0)
		return -1;
	for (;;) {
		uint32_t c;
		if (r->p >= r->end)
			return -1;
		if (*r->p == '"') {
			r->p++;
			break;
		}
		if (*r->p < 0x20)
			return -1;
		if (*r->p == '\\') {
			r->p++;
			if (r->p >= r->end)
				return -1;
			switch (*r->p++) {
			case '"': c = '"'; break;
			case '\\': c = '\\'; break;
			case '/': c = '/'; break;
			case 'b': c = '\b'; break;
			case 'f': c = '\f'; break;
			case 'n': c = '\n'; break;
			case 'r': c = '\r'; break;
			case 't': c = '\t'; break;
			case 'u':
				if (hex4(r, &c) != 0)
					return -1;
				if (c >= 0xD800 && c <= 0xDBFF) {
					uint32_t lo;
					if (r->end - r->p < 6 || r->p[0] != '\\' || r->p[1] != 'u')
						return -1;
					r->p += 2;
					if (hex4(r, &lo) != 0 || lo < 0xDC00 || lo > 0xDFFF)
						return -1;
					c = 0x10000 + ((c - 0xD800) << 10) + (lo - 0xDC00);
				}
				break;
			default:
				return -1;
			}
		} else if (utf8_char(r, &c) != 0) {
			return -1;
		}
		if (put_utf8(out, cap, &n, c) != 0)
			return -1;
	}
	out[n] = '\0';
	return 0;
}

/* A JSON integer: an optional minus and 1 to 15 digits, no fraction or
 * exponent (the broker writes none). */
static int read_int(struct reader *r, long long *v)
{
	int neg = 0, digits = 0;
	long long x = 0;
	skip_ws(r);
	if (r->p < r->end && *r->p == '-') {
		neg = 1;
		r->p++;
	}
	while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
		if (++digits > 15)
			return -1;
		x = x * 10 + (*r->p++ - '0');
	}
	if (digits == 0)
		return -1;
	if (r->p < r->end && (*r->p == '.' || *r->p == 'e' || *r->p == 'E'))
		return -1;
	*v = neg ? -x : x;
	return 0;
}

/* Array helpers: call item for each element; at most max elements. */
static int read_array(struct reader *r, int max, int (*item)(struct reader *, void *, int), void *ctx)
{
	int n = 0;
	if (expect(r, '[') != 0)
		return -1;
	skip_ws(r);
	if (r->p < r->end && *r->p == ']') {
		r->p++;
		return 0;
	}
	for (;;) {
		if (n >= max || item(r, ctx, n) != 0)
			return -1;
		n++;
		skip_ws(r);
		if (r->p < r->end && *r->p == ',') {
			r->p++;
			continue;
		}
		return expect(r, ']');
	}
}

/* The variables the broker puts in a session or sets for a lease
 * (npu.Inventory.Env and npu.HiddenEnv), and no other: whatever answers on
 * the socket, neither module ever puts a variable that changes what a
 * program loads or runs (LD_PRELOAD, PATH, ...). NPURUN_LEASE is each
 * module's own. */
static const char *const broker_env[] = {
	"NPURUN_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
	"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
};

/* valid_env: NAME=value, NAME one of broker_env, value of device lists and
 * plain words ([A-Za-z0-9_,.:-], possibly empty). */
static int valid_env(const char *s)
{
	const char *eq = strchr(s, '=');
	int known = 0;
	if (eq == NULL)
		return 0;
	for (size_t i = 0; i < sizeof broker_env / sizeof broker_env[0]; i++)
		if (strlen(broker_env[i]) == (size_t)(eq - s) && strncmp(s, broker_env[i], (size_t)(eq - s)) == 0)
			known = 1;
	if (!known)
		return 0;
	for (const char *p = eq + 1; *p != '\0'; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
		      *p == '_' || *p == ',' || *p == '.' || *p == ':' || *p == '-'))
			return 0;
	return 1;
}

static int env_item(struct reader *r, void *ctx, int i)
{
	struct reply *rp = ctx;
	char buf[MAX_STRING + 1];
	if (read_string(r, buf, sizeof buf) != 0 || !valid_env(buf))
		return -1;
	rp->env[i] = strdup(buf);
	if (rp->env[i] == NULL)
		return -1;
	rp->nenv = i + 1;
	return 0;
}

static int device_item(struct reader *r, void *ctx, int i)
{
	struct reply *rp = ctx;
	long long v;
	if (read_int(r, &v) != 0 || v < 0 || v > 1000000)
		return -1;
	rp->devices[i] = (int)v;
	rp->ndevices = i + 1;
	return 0;
}

static int skip_string_item(struct reader *r, void *ctx, int i)
{
	char buf[MAX_STRING + 1];
	(void)ctx;
	(void)i;
	return read_string(r, buf, sizeof buf);
}

static void free_reply(struct reply *rp)
{
	for (int i = 0; i < rp->nenv; i++)
		free(rp->env[i]);
	rp->nenv = 0;
}

/* parse_reply reads one reply: an object of the keys below, each with
 * its type, none twice, nothing else, nothing after it. */
static int npurun_parse_reply(const unsigned char *data, size_t len, struct reply *rp)
{
	struct reader r = {data, data + len};
	unsigned seen = 0;
	char key[32], scratch[MAX_STRING + 1];
	long long v;
	memset(rp->type, 0, sizeof rp->type);
	rp->code[0] = rp->message[0] = '\0';
	rp->nenv = rp->ndevices = 0;
	rp->wait_ms = 0;
	if (expect(&r, '{') != 0)
		goto bad;
	skip_ws(&r);
	if (r.p < r.end && *r.p == '}') {
		r.p++;
		goto end;
	}
	for (;;) {
		static const char *const keys[] = {
			"v", "type", "code", "message", "hint", "reason", "pool", "vendor",
			"env", "devices", "ahead", "position", "waited_ms", "wait_ms",
			"start",
		};
		unsigned bit = 0;
		int ok;
		if (read_string(&r, key, sizeof key) != 0 || expect(&r, ':') != 0)
			goto bad;
		for (unsigned k = 0; k < sizeof keys / sizeof keys[0]; k++)
			if (strcmp(key, keys[k]) == 0)
				bit = 1u << k;
		if (bit == 0 || (seen & bit) != 0)
			goto bad; /* unknown or repeated */
		seen |= bit;
		if (strcmp(key, "v") == 0)
			ok = read_int(&r, &v) == 0 && v == PROTOCOL_VERSION;
		else if (strcmp(key, "type") == 0)
			ok = read_string(&r, rp->type, sizeof rp->type) == 0;
		else if (strcmp(key, "code") == 0)
			ok = read_string(&r, rp->code, sizeof rp->code) == 0;
		else if (strcmp(key, "message") == 0)
			ok = read_string(&r, rp->message, sizeof rp->message) == 0;
		else if (strcmp(key, "env") == 0)
			ok = read_array(&r, MAX_ENV, env_item, rp) == 0;
		else if (strcmp(key, "devices") == 0)
			ok = read_array(&r, MAX_DEVICES, device_item, rp) == 0;
		else if (strcmp(key, "ahead") == 0)
			ok = read_array(&r, MAX_ENV, skip_string_item, NULL) == 0;
		else if (strcmp(key, "wait_ms") == 0)
#ifdef WIRE_MAX_WAIT_MS
			ok = read_int(&r, &rp->wait_ms) == 0 && rp->wait_ms >= 0 && rp->wait_ms <= WIRE_MAX_WAIT_MS;
#else
			ok = read_int(&r, &rp->wait_ms) == 0;
#endif
		else if (strcmp(key, "position") == 0 || strcmp(key, "waited_ms") == 0 ||
			 strcmp(key, "start") == 0)
			ok = read_int(&r, &v) == 0;
		else /* hint, reason, pool, vendor */
			ok = read_string(&r, scratch, sizeof scratch) == 0;
		if (!ok)
			goto bad;
		skip_ws(&r);
		if (r.p < r.end && *r.p == ',') {
			r.p++;
			continue;
		}
		if (expect(&r, '}') != 0)
			goto bad;
		break;
	}
end:
	skip_ws(&r);
	if (r.p != r.end || (seen & 3u) != 3u) /* v and type are required */
		goto bad;
	return 0;
bad:
	free_reply(rp);
	return -1;
}

/* ---- talking to the broker ------------------------------------------ */

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* wait_for polls fd for events until deadline (ms, monotonic); 0 when
 * ready, -1 on timeout or error. */
static int wait_for(int fd, short events, long long deadline)
{
	for (;;) {
		struct pollfd p = {.fd = fd, .events = events};
		long long left = deadline - now_ms();
		int n;
		if (left < 0)
			left = 0;
		n = poll(&p, 1, (int)(left > INT_MAX ? INT_MAX : left));
		if (n > 0)
			return 0;
		if (n == 0 || (n < 0 && errno != EINTR))
			return -1;
	}
}

static void close_fds(int *fds, int n)
{
	for (int i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

/* recv_reply reads one packet with its descriptors (MSG_CMSG_CLOEXEC): 0,
 * or -1 with *why set. A packet or control data larger than the caps is
 * refused, its descriptors closed. */
static int recv_reply(int sock, unsigned char *buf, size_t cap, size_t *len, int *fds, int *nfds, const char **why)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * MAX_DEVICES)];
	} ctl;
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	ssize_t n;
	*nfds = 0;
	do
		n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	if (n < 0) {
		*why = strerror(errno);
		return -1;
	}
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c != NULL; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(0)) {
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (*nfds < MAX_DEVICES)
					fds[(*nfds)++] = fd;
				else
					close(fd);
			}
		}
	}
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || n == 0) {
		close_fds(fds, *nfds);
		*nfds = 0;
		*why = n == 0 ? "connection closed" : "too large";
		return -1;
	}
	*len = (size_t)n;
	return 0;
}

/* What went wrong, for the module to log as it logs: WIRE_DOWN, no
 * broker to talk to (or none in time); WIRE_BAD, something else (a
 * system call, an answer not read, an impostor); WIRE_NOMEM, no memory. */
enum wire_fail { WIRE_DOWN, WIRE_BAD, WIRE_NOMEM };

/*
 * wire_connect connects to the socket at path by deadline and checks who
 * serves it: the broker runs as root, and an answer from anyone else (a
 * socket= path someone else could bind) is no answer. A full listen queue
 * is waited on (SO_SNDTIMEO), not taken for a broker that is down. The
 * socket is returned non-blocking, or -1 with why and *fail set. no_room
 * is the module's words for a queue still full at the deadline, not_root
 * its words after "... not by root: ".
 */
static int wire_connect(const char *path, long long deadline, const char *no_room, const char *not_root, char *why,
			size_t whycap, enum wire_fail *fail)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct ucred cred;
	socklen_t credlen = sizeof cred;
	int sock;

	*fail = WIRE_BAD;
	if (strlen(path) >= sizeof addr.sun_path) {
		snprintf(why, whycap, "socket path too long: %s", path);
		return -1;
	}
	memcpy(addr.sun_path, path, strlen(path) + 1);
	sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (sock < 0) {
		snprintf(why, whycap, "socket: %s", strerror(errno));
		return -1;
	}
	for (;;) {
		long long left = deadline - now_ms();
		struct timeval tv;
		if (left < 1)
			left = 1;
		tv.tv_sec = (time_t)(left / 1000);
		tv.tv_usec = (suseconds_t)(left % 1000) * 1000;
		if (setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) != 0) {
			snprintf(why, whycap, "setsockopt: %s", strerror(errno));
			goto fail;
		}
		if (connect(sock, (struct sockaddr *)&addr, sizeof addr) == 0 || errno == EISCONN)
			break;
		if ((errno == EINTR || errno == EAGAIN) && now_ms() < deadline)
			continue;
		snprintf(why, whycap, "connect %s: %s", path, errno == EAGAIN ? no_room : strerror(errno));
		*fail = WIRE_DOWN;
		goto fail;
	}
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
		snprintf(why, whycap, "%s: peer credentials: %s", path, strerror(errno));
		goto fail;
	}
	if (cred.uid != 0) {
		snprintf(why, whycap, "%s is served by uid %u (pid %d), not by root: %s", path, (unsigned)cred.uid,
			 (int)cred.pid, not_root);
		goto fail;
	}
	if (fcntl(sock, F_SETFL, O_NONBLOCK) != 0) {
		snprintf(why, whycap, "fcntl: %s", strerror(errno));
		goto fail;
	}
	return sock;
fail:
	close(sock);
	return -1;
}

/* wire_send sends the request req (n bytes) on sock (connected,
 * non-blocking, to the broker at path) by deadline: 0, or -1 with why. */
static int wire_send(int sock, const char *path, long long deadline, const char *req, size_t n, char *why,
		     size_t whycap)
{
	for (;;) {
		ssize_t w = send(sock, req, n, MSG_NOSIGNAL);
		if (w == (ssize_t)n)
			return 0;
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN && wait_for(sock, POLLOUT, deadline) == 0)
			continue;
		snprintf(why, whycap, "send to %s: %s", path, w < 0 ? strerror(errno) : "short write");
		return -1;
	}
}

/*
 * wire_receive reads replies on sock until one that is not "queued": 0
 * with *rp filled (a grant with as many descriptors as devices, other
 * answers with none), -1 with why and *fail set when no usable answer
 * came by the deadline. Nothing it received is left open but a grant's
 * descriptors in *rp. With extend_ms >= 0, the first on_busy wait the
 * broker announces moves the deadline, once, to that wait and extend_ms
 * from now: a broker that announces again and again does not keep the
 * caller waiting past it; with extend_ms < 0 the deadline stands.
 * no_answer is the module's words for no answer by the deadline, self
 * its name in "the broker's answer is not one this <self> reads".
 */
static int wire_receive(int sock, long long deadline, long extend_ms, const char *no_answer, const char *self,
			struct reply *rp, char *why, size_t whycap, enum wire_fail *fail)
{
	unsigned char *buf = malloc(MAX_MESSAGE + 1);
	int rc = -1, extended = 0;

	if (buf == NULL) {
		snprintf(why, whycap, "out of memory");
		*fail = WIRE_NOMEM;
		return -1;
	}
	for (int replies = 0; replies < 1000; replies++) {
		size_t len = 0;
		const char *reason = "";
		*fail = WIRE_DOWN;
		if (wait_for(sock, POLLIN, deadline) != 0) {
			snprintf(why, whycap, "%s", no_answer);
			break;
		}
		if (recv_reply(sock, buf, MAX_MESSAGE + 1, &len, rp->fds, &rp->nfds, &reason) != 0) {
			snprintf(why, whycap, "read the broker's answer: %s", reason);
			break;
		}
		*fail = WIRE_BAD;
		if (npurun_parse_reply(buf, len, rp) != 0) {
			snprintf(why, whycap, "the broker's answer is not one this %s reads (%zu bytes)", self, len);
			close_fds(rp->fds, rp->nfds);
			rp->nfds = 0;
			break;
		}
		if (strcmp(rp->type, "grant") != 0 && rp->nfds > 0) {
			close_fds(rp->fds, rp->nfds); /* descriptors belong to grants only */
			rp->nfds = 0;
		}
		if (strcmp(rp->type, "queued") == 0) {
			if (extend_ms >= 0 && rp->wait_ms > 0 && !extended) {
				deadline = now_ms() + rp->wait_ms + extend_ms;
				extended = 1;
			}
			free_reply(rp);
			continue;
		}
		if (strcmp(rp->type, "grant") == 0 && (rp->nfds != rp->ndevices || rp->nfds == 0)) {
			snprintf(why, whycap, "a grant of %d devices came with %d descriptors", rp->ndevices, rp->nfds);
			close_fds(rp->fds, rp->nfds);
			rp->nfds = 0;
			free_reply(rp);
			break;
		}
		rc = 0;
		break;
	}
	free(buf);
	return rc;
}
