/*
 * spank_npurun.so: npurun's SPANK plugin, a thin client of npubroker in
 * slurmstepd. A Slurm job whose Prolog told the broker of its devices
 * (npurun-slurm prolog) holds a lease of them for its life:
 *
 *   slurm_spank_init, in the job's extern step (PrologFlags=Contain),
 *   as root: asks the broker for the lease's descriptors
 *   ({"op":"slurm-hold"}) and keeps them, close-on-exec, for the
 *   step's life, which is the job's. The broker then holds no copy: the
 *   lease ends when the job's processes are gone, however the job ends.
 *
 *   slurm_spank_task_init_privileged, in each task's process before
 *   slurmstepd gives it to the user (root): asks for copies
 *   ({"op":"slurm-task"}), places them at descriptor 20 and above
 *   (close-on-exec clear, as npurun places a lease: a login bash marks
 *   3 to 19 close-on-exec), and keeps the variables of the answer.
 *   slurm_spank_task_init, in the same process just before execve, after
 *   Slurm has set its own GRES variables, sets them (NPURUN_DEVICES, the
 *   vendor's variable) and NPURUN_LEASE.
 *
 * Both requests come from root and name the job slurmstepd runs
 * (spank_get_item), so a user can neither forge them nor ask for
 * another job's lease: the broker answers root only. The plugin never
 * fails a job for npurun's sake: no broker answering within timeout=,
 * an answer it cannot read, or a refusal is logged (slurm_error, in
 * slurmd's log) and the job runs as Slurm made it, without the lease.
 *
 * plugstack.conf: optional /PATH/spank_npurun.so [socket=PATH]
 * [timeout=SECONDS] [debug]. See spank_npurun(8).
 */

#define _GNU_SOURCE
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

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(npurun, 1);

#define DEFAULT_SOCKET "/run/npurun/broker.sock"
#define PROTOCOL_VERSION 1
#define MAX_MESSAGE (64 * 1024) /* the broker's MaxMessage */
#define MAX_DEVICES 64          /* the broker's MaxDevices */
#define MAX_ENV 16
#define MAX_STRING 4096
#define FIRST_LEASE_FD 20 /* client.FirstLeaseFD */

struct options {
	const char *socket;
	long timeout_ms;
	int debug;
};

/* A reply, as the strict reader accepts it. */
struct reply {
	char type[16];
	char code[32];
	char message[MAX_STRING + 1];
	char *env[MAX_ENV];
	int nenv;
	int devices[MAX_DEVICES];
	int ndevices;
	int fds[MAX_DEVICES];
	int nfds;
};

/* The extern step's descriptors, held for its life. */
static int held[MAX_DEVICES];
static int nheld;

/* A task's lease, from task_init_privileged to task_init (one process). */
static struct {
	int ready;
	char *env[MAX_ENV + 1]; /* the broker's variables and NPURUN_LEASE */
	int nenv;
} task;

/* ---- the strict reader (as pam_npurun.c's) ---------------------------- */

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

/* One UTF-8 sequence, validated (no overlong forms, no surrogates). */
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

/* A JSON string into out (at most cap-1 bytes and a NUL); NUL, invalid
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

/* A JSON integer: an optional minus and 1 to 15 digits, nothing more. */
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

/* The variables the broker sets for a lease (npu.Inventory.Env), and no
 * other: whatever answers on the socket, the plugin never sets a variable
 * that changes what a program loads or runs. NPURUN_LEASE is its own. */
static const char *const broker_env[] = {
	"NPURUN_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES",
	"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER",
};

/* valid_env: NAME=value, NAME one of broker_env, the value device lists
 * and plain words ([A-Za-z0-9_,.:-], possibly empty). */
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

/* parse_reply reads one reply: an object of the keys below, each with its
 * type, none twice, nothing else, nothing after it; v and type required. */
static int npurun_parse_reply(const unsigned char *data, size_t len, struct reply *rp)
{
	struct reader r = {data, data + len};
	unsigned seen = 0;
	char key[32], scratch[MAX_STRING + 1];
	long long v;
	memset(rp->type, 0, sizeof rp->type);
	rp->code[0] = rp->message[0] = '\0';
	rp->nenv = rp->ndevices = 0;
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
		else if (strcmp(key, "position") == 0 || strcmp(key, "waited_ms") == 0 || strcmp(key, "wait_ms") == 0)
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
	if (r.p != r.end || (seen & 3u) != 3u)
		goto bad;
	return 0;
bad:
	free_reply(rp);
	return -1;
}

/* ---- talking to the broker ------------------------------------------- */

static long long now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

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
 * or -1 with *why set; a packet or control data past the caps is refused
 * and its descriptors closed. */
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

/* connect_broker connects by deadline and checks that root serves the
 * socket; the socket is returned non-blocking, or -1 with *why set. */
static int connect_broker(const struct options *o, long long deadline, char *why, size_t whycap)
{
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	struct ucred cred;
	socklen_t credlen = sizeof cred;
	int sock;

	if (strlen(o->socket) >= sizeof addr.sun_path) {
		snprintf(why, whycap, "socket path too long: %s", o->socket);
		return -1;
	}
	memcpy(addr.sun_path, o->socket, strlen(o->socket) + 1);
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
		snprintf(why, whycap, "connect %s: %s", o->socket, errno == EAGAIN ? "no room in time" : strerror(errno));
		goto fail;
	}
	if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &credlen) != 0) {
		snprintf(why, whycap, "%s: peer credentials: %s", o->socket, strerror(errno));
		goto fail;
	}
	if (cred.uid != 0) {
		snprintf(why, whycap, "%s is served by uid %u (pid %d), not by root: not the broker", o->socket, (unsigned)cred.uid, (int)cred.pid);
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

/*
 * ask_on sends req on sock (connected, non-blocking) and reads replies until
 * one that is not "queued": 0 with *rp filled (a grant with as many
 * descriptors as devices, other answers with none), -1 with *why set when
 * no usable answer came by the deadline. Nothing it received is left open
 * but a grant's descriptors in *rp.
 */
static int ask_on(const struct options *o, int sock, long long deadline, const char *req, struct reply *rp, char *why,
		  size_t whycap)
{
	unsigned char *buf;
	int rc = -1;
	size_t n = strlen(req);

	for (;;) {
		ssize_t w = send(sock, req, n, MSG_NOSIGNAL);
		if (w == (ssize_t)n)
			break;
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno == EAGAIN && wait_for(sock, POLLOUT, deadline) == 0)
			continue;
		snprintf(why, whycap, "send to %s: %s", o->socket, w < 0 ? strerror(errno) : "short write");
		return -1;
	}
	buf = malloc(MAX_MESSAGE + 1);
	if (buf == NULL) {
		snprintf(why, whycap, "out of memory");
		return -1;
	}
	for (int replies = 0; replies < 1000; replies++) {
		size_t len = 0;
		const char *reason = "";
		if (wait_for(sock, POLLIN, deadline) != 0) {
			snprintf(why, whycap, "no answer from the broker at %s within %ld ms", o->socket, o->timeout_ms);
			break;
		}
		if (recv_reply(sock, buf, MAX_MESSAGE + 1, &len, rp->fds, &rp->nfds, &reason) != 0) {
			snprintf(why, whycap, "read the broker's answer: %s", reason);
			break;
		}
		if (npurun_parse_reply(buf, len, rp) != 0) {
			snprintf(why, whycap, "the broker's answer is not one this plugin reads (%zu bytes)", len);
			close_fds(rp->fds, rp->nfds);
			rp->nfds = 0;
			break;
		}
		if (strcmp(rp->type, "grant") != 0 && rp->nfds > 0) {
			close_fds(rp->fds, rp->nfds); /* descriptors belong to grants only */
			rp->nfds = 0;
		}
		if (strcmp(rp->type, "queued") == 0) {
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

/* ask connects to the broker and asks req (ask_on). */
static int ask(const struct options *o, const char *req, struct reply *rp, char *why, size_t whycap)
{
	long long deadline = now_ms() + o->timeout_ms;
	int sock, rc;

	if ((sock = connect_broker(o, deadline, why, whycap)) < 0)
		return -1;
	rc = ask_on(o, sock, deadline, req, rp, why, whycap);
	close(sock);
	return rc;
}

/* ---- the job --------------------------------------------------------- */

static void parse_args(int ac, char **av, struct options *o)
{
	o->socket = DEFAULT_SOCKET;
	o->timeout_ms = 2000;
	o->debug = 0;
	for (int i = 0; i < ac; i++) {
		if (strncmp(av[i], "socket=", 7) == 0 && av[i][7] == '/') {
			o->socket = av[i] + 7;
		} else if (strncmp(av[i], "timeout=", 8) == 0) {
			char *end;
			double s = strtod(av[i] + 8, &end);
			if (*end != '\0' || !(s > 0 && s <= 600))
				slurm_error("spank_npurun: bad argument %s (seconds, more than 0, at most 600): using %ld ms", av[i], o->timeout_ms);
			else
				o->timeout_ms = (long)(s * 1000 + 0.5);
		} else if (strcmp(av[i], "debug") == 0) {
			o->debug = 1;
		} else {
			slurm_error("spank_npurun: unknown argument %s (known: socket=PATH, timeout=SECONDS, debug)", av[i]);
		}
	}
}

/* job_ids reads the job's id, user and step from slurmstepd. */
static int job_ids(spank_t sp, uint32_t *job, uint32_t *uid, uint32_t *step)
{
	uid_t u;
	if (spank_get_item(sp, S_JOB_ID, job) != ESPANK_SUCCESS || spank_get_item(sp, S_JOB_UID, &u) != ESPANK_SUCCESS ||
	    spank_get_item(sp, S_JOB_STEPID, step) != ESPANK_SUCCESS)
		return -1;
	*uid = (uint32_t)u;
	return 0;
}

static void device_list(const struct reply *rp, char *out, size_t cap)
{
	size_t n = 0;
	out[0] = '\0';
	for (int i = 0; i < rp->ndevices && n < cap; i++)
		n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", rp->devices[i]);
}

/*
 * slurm_spank_init: in the job's extern step, hold the job's lease. In
 * every other place the plugin is loaded (srun, sbatch, slurmd, other
 * steps) it does nothing here.
 */
int slurm_spank_init(spank_t sp, int ac, char **av)
{
	struct options o;
	struct reply *rp;
	uint32_t job, uid, step;
	char req[256], why[512], list[MAX_DEVICES * 8];

	if (spank_context() != S_CTX_REMOTE || job_ids(sp, &job, &uid, &step) != 0 || step != SLURM_EXTERN_CONT)
		return ESPANK_SUCCESS;
	parse_args(ac, av, &o);
	snprintf(req, sizeof req, "{\"v\":%d,\"op\":\"slurm-hold\",\"job\":{\"id\":%u,\"uid\":%u}}", PROTOCOL_VERSION, job, uid);
	rp = calloc(1, sizeof *rp);
	if (rp == NULL)
		return ESPANK_SUCCESS;
	if (ask(&o, req, rp, why, sizeof why) != 0) {
		slurm_error("spank_npurun: job %u: %s: the job runs without npurun's lease of its devices", job, why);
	} else if (strcmp(rp->type, "grant") == 0) {
		close_fds(held, nheld);
		memcpy(held, rp->fds, sizeof(int) * (size_t)rp->nfds);
		nheld = rp->nfds;
		rp->nfds = 0;
		device_list(rp, list, sizeof list);
		slurm_info("spank_npurun: job %u holds its lease of devices %s", job, list);
	} else if (strcmp(rp->type, "ignore") == 0) {
		if (o.debug)
			slurm_info("spank_npurun: job %u: no lease to hold", job);
	} else {
		slurm_error("spank_npurun: job %u: the broker answered %s%s%s: the job runs without npurun's lease", job, rp->type,
			    rp->message[0] ? ": " : "", rp->message);
	}
	close_fds(rp->fds, rp->nfds);
	free_reply(rp);
	free(rp);
	return ESPANK_SUCCESS;
}

/*
 * take_task_lease keeps what the broker answered a task (rp): a grant's
 * descriptors placed at FIRST_LEASE_FD and above, close-on-exec clear, and
 * its variables with NPURUN_LEASE naming them, for task_init. Anything
 * else is logged; rp's own descriptors are the caller's to close.
 */
static void take_task_lease(uint32_t job, struct reply *rp)
{
	char lease[32 + MAX_DEVICES * 24];
	size_t n;
	int placed[MAX_DEVICES], nplaced = 0;

	if (strcmp(rp->type, "ignore") == 0)
		return;
	if (strcmp(rp->type, "grant") != 0) {
		slurm_error("spank_npurun: job %u: task: the broker answered %s%s%s: the task runs without npurun's lease", job,
			    rp->type, rp->message[0] ? ": " : "", rp->message);
		return;
	}
	n = (size_t)snprintf(lease, sizeof lease, "NPURUN_LEASE=");
	for (int i = 0; i < rp->nfds; i++) {
		int fd = fcntl(rp->fds[i], F_DUPFD, FIRST_LEASE_FD); /* close-on-exec clear */
		if (fd < 0) {
			slurm_error("spank_npurun: job %u: task: place the lease: %s: the task runs without it", job, strerror(errno));
			close_fds(placed, nplaced);
			return;
		}
		placed[nplaced++] = fd;
		n += (size_t)snprintf(lease + n, sizeof lease - n, "%s%d:%d", i ? "," : "", rp->devices[i], fd);
	}
	for (int i = 0; i < rp->nenv && task.nenv < MAX_ENV; i++) {
		task.env[task.nenv++] = rp->env[i];
		rp->env[i] = NULL;
	}
	task.env[task.nenv] = strdup(lease);
	if (task.env[task.nenv] == NULL) {
		close_fds(placed, nplaced);
		return;
	}
	task.nenv++;
	task.ready = 1;
}

/*
 * slurm_spank_task_init_privileged: still root, in the task's own
 * process: copies of the job's lease, placed where the command keeps
 * them, and the variables to set before execve.
 */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
	struct options o;
	struct reply *rp;
	uint32_t job, uid, step;
	char req[256], why[512];

	if (spank_context() != S_CTX_REMOTE || job_ids(sp, &job, &uid, &step) != 0 || step == SLURM_EXTERN_CONT)
		return ESPANK_SUCCESS;
	parse_args(ac, av, &o);
	snprintf(req, sizeof req, "{\"v\":%d,\"op\":\"slurm-task\",\"job\":{\"id\":%u,\"uid\":%u,\"step\":%u}}",
		 PROTOCOL_VERSION, job, uid, step);
	rp = calloc(1, sizeof *rp);
	if (rp == NULL)
		return ESPANK_SUCCESS;
	if (ask(&o, req, rp, why, sizeof why) != 0) {
		slurm_error("spank_npurun: job %u: task: %s: the task runs without npurun's lease", job, why);
		goto out;
	}
	take_task_lease(job, rp);
out:
	close_fds(rp->fds, rp->nfds);
	free_reply(rp);
	free(rp);
	return ESPANK_SUCCESS;
}

/*
 * slurm_spank_task_init: just before execve, after Slurm set its own GRES
 * variables: the lease's variables, which name the devices as npurun does
 * (Ascend: the runtime's logical ids), and NPURUN_LEASE.
 */
int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	(void)ac;
	(void)av;
	if (!task.ready)
		return ESPANK_SUCCESS;
	for (int i = 0; i < task.nenv; i++) {
		char *eq = strchr(task.env[i], '=');
		if (eq == NULL)
			continue;
		*eq = '\0';
		if (spank_setenv(sp, task.env[i], eq + 1, 1) != ESPANK_SUCCESS)
			slurm_error("spank_npurun: task: could not set %s", task.env[i]);
		*eq = '=';
	}
	return ESPANK_SUCCESS;
}

/* slurm_spank_exit: the extern step lets its descriptors go as it ends. */
int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	(void)sp;
	(void)ac;
	(void)av;
	close_fds(held, nheld);
	nheld = 0;
	return ESPANK_SUCCESS;
}
