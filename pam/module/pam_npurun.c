/*
 * pam_npurun.so: the session module of npurun, a thin client of npubroker.
 *
 * pam_sm_open_session asks the broker what the session of PAM_USER gets
 * (one JSON request over the broker's SOCK_SEQPACKET socket, naming the
 * user, service, tty and remote host) and carries out the verdict:
 *
 *   ignore  not a restricted account: PAM_IGNORE, nothing changed
 *   hide    no lease: pam_putenv the variables that hide every device
 *   grant   a lease (module argument "lease", or a service named by
 *           "lease_services="): the lock descriptors arrive
 *           as SCM_RIGHTS; they are kept for the PAM handle's life
 *           (pam_set_data, whose cleanup closes them) and inherited by the
 *           session's processes (NPURUN_LEASE names them), as under npurun
 *   error   the session is refused: pam_error the message, PAM_SESSION_ERR
 *
 * Every decision is the broker's (Go, the pam package); this file only
 * connects, asks, reads one bounded reply with a strict reader, and obeys.
 * No broker answering within timeout= (or an answer it cannot read) is
 * "broker down": the session-policy file the broker wrote beside its
 * socket then says whether a restricted account logs in without a device
 * or not at all.
 *
 * Module arguments: socket=PATH, timeout=SECONDS (default 2, fractions
 * allowed; an on_busy wait the broker announces is added to it), lease,
 * lease_services=SERVICE[,SERVICE...] (lease for those PAM services only:
 * one line in common-session serves sshd, login and su -l), debug. See
 * pam_npurun(8).
 */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include <security/pam_ext.h>
#include <security/pam_modules.h>

/* Checked against the Go side by c/ctest (go test ./c/ctest): the
 * session-policy file's name and size cap as the Go reader has them, a wait
 * no shorter than the longest on_busy wait policy allows, and hidden_env
 * below. */
#define POLICY_FILE "session-policy"
#define MAX_POLICY (64 * 1024)
#define MAX_WAIT_MS (11 * 60 * 1000) /* the longest on_busy wait, and then some */
#define DATA_NAME "pam_npurun_lease"

/* The request's strings, in bytes as the broker decodes them: the user's
 * name whole or not at all; the origin fields (the broker's caps) cut at a
 * character. Escaped, a byte takes at most 6 ("\u001f"). */
#define MAX_USER 256
#define MAX_SERVICE 64
#define MAX_TTY 256
#define MAX_RHOST 1024
#define MAX_REQUEST (256 + 6 * (MAX_USER + MAX_SERVICE + MAX_TTY + MAX_RHOST))

/* NSS buffers grow to at most this (getpwnam_r and getgrnam_r, ERANGE). */
#define MAX_NSS_BUF (1024 * 1024)
#define MAX_GROUPS 65536

/* The variables that hide every device: npu.HiddenEnv (c/ctest). */
static const char *const hidden_env[] = {
	"NPURUN_DEVICES=", "ASCEND_RT_VISIBLE_DEVICES=", "CUDA_VISIBLE_DEVICES=",
};

struct options {
	const char *socket;
	long timeout_ms;
	int lease;                  /* take the login lease: "lease", or PAM_SERVICE in lease_services */
	const char *lease_services; /* comma-separated PAM services that take it; NULL: none */
	int debug;
};

/* The wire code shared with spank_npurun.c: caps, struct reply, the strict
 * reader, connect, send and receive (see its head comment). A reply's
 * wait_ms is checked against, and kept for, the on_busy wait. */
#define WIRE_MAX_WAIT_MS MAX_WAIT_MS
#include "../../c/npurun_wire.c"

/* ---- talking to the broker ------------------------------------------ */

/*
 * Bounded appends to the request: *n never passes cap - 1, and a request
 * that does not fit is marked by *n == cap (the caller refuses it).
 */
static void put_raw(char *buf, size_t cap, size_t *n, const char *s)
{
	size_t k = strlen(s);
	if (*n >= cap)
		return;
	if (*n + k >= cap) {
		*n = cap;
		return;
	}
	memcpy(buf + *n, s, k + 1);
	*n += k;
}

/* utf8_len is the length of the valid UTF-8 sequence at s (at most avail
 * bytes), 0 if there is none. */
static size_t utf8_len(const unsigned char *s, size_t avail)
{
	struct reader r = {s, s + avail};
	uint32_t c;
	if (avail == 0 || utf8_char(&r, &c) != 0)
		return 0;
	return (size_t)(r.p - s);
}

/*
 * put_json appends s as a JSON string whose decoded form is at most max
 * bytes of valid UTF-8: control characters escaped, a byte that starts no
 * valid sequence written as '?', and s cut at a character, never inside
 * one. So the broker decodes exactly what was meant, within its caps (an
 * invalid byte would otherwise decode to three, U+FFFD, and a request
 * past the broker's cap is refused).
 */
static void put_json(char *buf, size_t cap, size_t *n, const char *s, size_t max)
{
	static const char hex[] = "0123456789abcdef";
	const unsigned char *u = (const unsigned char *)(s != NULL ? s : "");
	size_t len = strlen((const char *)u), used = 0;
	if (*n >= cap || *n + 2 >= cap) {
		*n = cap;
		return;
	}
	buf[(*n)++] = '"';
	for (size_t i = 0; i < len;) {
		char e[8];
		size_t k = 0, in = 1, out = 1;
		unsigned char c = u[i];
		if (c == '"' || c == '\\') {
			e[k++] = '\\';
			e[k++] = (char)c;
		} else if (c < 0x20 || c == 0x7f) {
			memcpy(e, "\\u00", 4);
			e[4] = hex[c >> 4];
			e[5] = hex[c & 15];
			k = 6;
		} else if (c < 0x80) {
			e[k++] = (char)c;
		} else if ((in = utf8_len(u + i, len - i)) == 0) {
			e[k++] = '?';
			in = 1;
		} else {
			memcpy(e, u + i, in);
			k = out = in;
		}
		if (used + out > max)
			break;
		if (*n + k + 2 >= cap) {
			*n = cap;
			return;
		}
		memcpy(buf + *n, e, k);
		*n += k;
		used += out;
		i += in;
	}
	buf[(*n)++] = '"';
	buf[*n] = '\0';
}

/* valid_utf8 tells whether s is valid UTF-8 throughout. */
static int valid_utf8(const char *s)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t len = strlen(s);
	for (size_t i = 0; i < len;) {
		size_t k = utf8_len(u + i, len - i);
		if (k == 0)
			return 0;
		i += k;
	}
	return 1;
}

/*
 * build_request writes the session request into req (MAX_REQUEST bytes):
 * 0, or -1 where the user's name cannot be sent as it is (too long, not
 * UTF-8): a name cut or mended would be another account's.
 */
static int build_request(char *req, size_t cap, size_t *len, const char *user, const char *service,
			 const char *tty, const char *rhost, int login)
{
	size_t n;
	if (strlen(user) > MAX_USER || !valid_utf8(user))
		return -1;
	n = (size_t)snprintf(req, cap, "{\"v\":%d,\"op\":\"session\",\"user\":", PROTOCOL_VERSION);
	put_json(req, cap, &n, user, MAX_USER);
	put_raw(req, cap, &n, ",\"service\":");
	put_json(req, cap, &n, service, MAX_SERVICE);
	put_raw(req, cap, &n, ",\"tty\":");
	put_json(req, cap, &n, tty, MAX_TTY);
	put_raw(req, cap, &n, ",\"rhost\":");
	put_json(req, cap, &n, rhost, MAX_RHOST);
	put_raw(req, cap, &n, login ? ",\"login\":true}" : ",\"login\":false}");
	if (n >= cap)
		return -1;
	*len = n;
	return 0;
}

/*
 * receive reads replies on sock until one that is not "queued"
 * (wire_receive): 0 with *rp filled (a grant with as many descriptors as
 * devices), -1 when no usable answer came by the deadline. The first
 * on_busy wait the broker announces moves the deadline, once: a broker that
 * announces again and again does not keep the login waiting past timeout=
 * and the longest wait.
 */
static int receive(pam_handle_t *pamh, const struct options *o, int sock, long long deadline, struct reply *rp)
{
	char why[512], no_answer[512];
	enum wire_fail fail;

	snprintf(no_answer, sizeof no_answer, "no answer from the broker at %s in time", o->socket);
	if (wire_receive(sock, deadline, o->timeout_ms, no_answer, "module", rp, why, sizeof why, &fail) == 0)
		return 0;
	if (fail != WIRE_NOMEM)
		pam_syslog(pamh, fail == WIRE_DOWN ? LOG_WARNING : LOG_ERR, "%s", why);
	return -1;
}

/* ask sends the session request and reads the answer: 0 with *rp filled,
 * -1 when no usable answer came in time. */
static int ask(pam_handle_t *pamh, const struct options *o, const char *user, struct reply *rp)
{
	const void *service = NULL, *tty = NULL, *rhost = NULL;
	char req[MAX_REQUEST], why[512], no_room[64];
	enum wire_fail fail;
	size_t n = 0;
	long long deadline = now_ms() + o->timeout_ms;
	int sock, rc = -1;

	pam_get_item(pamh, PAM_SERVICE, &service);
	pam_get_item(pamh, PAM_TTY, &tty);
	pam_get_item(pamh, PAM_RHOST, &rhost);
	if (build_request(req, sizeof req, &n, user, service, tty, rhost, o->lease) != 0) {
		pam_syslog(pamh, LOG_ERR, "the user's name is longer than %d bytes or not UTF-8: not asked", MAX_USER);
		return -1;
	}
	snprintf(no_room, sizeof no_room, "no room within %ld ms", o->timeout_ms);
	if ((sock = wire_connect(o->socket, deadline, no_room, "not the broker, not asked", why, sizeof why, &fail)) < 0) {
		pam_syslog(pamh, fail == WIRE_DOWN ? LOG_WARNING : LOG_ERR, "%s", why);
		return -1;
	}
	if (wire_send(sock, o->socket, deadline, req, n, why, sizeof why) != 0) {
		pam_syslog(pamh, LOG_WARNING, "%s", why);
		goto out;
	}
	rc = receive(pamh, o, sock, deadline, rp);
out:
	close(sock);
	return rc;
}

/* ---- broker down ----------------------------------------------------- */

/*
 * NSS lookups with buffers that grow on ERANGE (an account with a long
 * entry, a group with many members), so that a big entry is never taken
 * for a missing one. Each returns 0 with the entry, -1 otherwise; *buf is
 * the caller's to free.
 */
static int lookup_user(const char *name, struct passwd *pw, char **buf)
{
	struct passwd *res = NULL;
	for (size_t size = 4096; size <= MAX_NSS_BUF; size *= 2) {
		char *b = realloc(*buf, size);
		int err;
		if (b == NULL)
			return -1;
		*buf = b;
		err = getpwnam_r(name, pw, b, size, &res);
		if (err == ERANGE)
			continue;
		return err == 0 && res != NULL ? 0 : -1;
	}
	return -1;
}

static int lookup_group(const char *name, struct group *gr, char **buf)
{
	struct group *res = NULL;
	for (size_t size = 4096; size <= MAX_NSS_BUF; size *= 2) {
		char *b = realloc(*buf, size);
		int err;
		if (b == NULL)
			return -1;
		*buf = b;
		err = getgrnam_r(name, gr, b, size, &res);
		if (err == ERANGE)
			continue;
		return err == 0 && res != NULL ? 0 : -1;
	}
	return -1;
}

/* user_groups returns the groups (primary first) of the account pw in a
 * new array, their count in *n; NULL if out of memory. */
static gid_t *user_groups(const struct passwd *pw, int *n)
{
	gid_t *groups = NULL;
	int want = 64;
	*n = 0;
	for (int tries = 0; tries < 4 && want <= MAX_GROUPS; tries++) {
		gid_t *g = realloc(groups, (size_t)want * sizeof *g);
		int got = want;
		if (g == NULL)
			break;
		groups = g;
		if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &got) >= 0) {
			*n = got;
			return groups;
		}
		want = got > want ? got : want * 2; /* got: how many there are */
	}
	/* Too many to list: the primary group at least. */
	free(groups);
	groups = malloc(sizeof *groups);
	if (groups != NULL) {
		groups[0] = pw->pw_gid;
		*n = 1;
	}
	return groups;
}

/* policy_fields splits line at ASCII blanks into at most max fields (NUL
 * written after each) and returns how many, max + 1 if there are more. */
static int policy_fields(char *line, char **f, int max)
{
	int n = 0;
	for (char *p = line;;) {
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\v' || *p == '\f')
			p++;
		if (*p == '\0')
			return n;
		if (n == max)
			return max + 1;
		f[n++] = p;
		while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\r' && *p != '\v' && *p != '\f')
			p++;
		if (*p != '\0')
			*p++ = '\0';
	}
}

/* policy_id reads an id of the file: decimal digits only, within 32 bits;
 * -1 if it is not one. */
static long long policy_id(const char *s)
{
	long long v = 0;
	if (*s == '\0')
		return -1;
	for (; *s != '\0'; s++) {
		if (*s < '0' || *s > '9')
			return -1;
		v = v * 10 + (*s - '0');
		if (v > 0xffffffffLL)
			return -1;
	}
	return v;
}

/* restricted_down reads the session-policy file beside the socket: -1 if
 * there is none to trust, else whether user is restricted, with *deny set
 * from on_broker_down.
 *
 * The file is read as npurun --login reads it (client.ParseSessionPolicy:
 * lines at '\n', fields at ASCII blanks, '#' comments, exact field counts,
 * ids of digits within 32 bits or "-"; anything else, a NUL byte or no
 * on_broker_down line, and there is no file to go by), and the rule is
 * client.SessionPolicy.Restricts's; the same table of accounts and files
 * runs through both (tests/e2e/access/e2e_pam_rule_test.go). The account is the user
 * database's for user: its uid, name and groups (getgrouplist). Root (uid 0)
 * never is restricted; "user NAME ID" restricts uid ID and the account named
 * NAME; "group NAME ID" restricts the members of group ID, or with ID "-",
 * of the group named NAME now. A user the database does not know is matched
 * by name alone. */
static int restricted_down(pam_handle_t *pamh, const struct options *o, const char *user, int *deny)
{
	char path[PATH_MAX], *data = NULL, *line, *next, *pwbuf = NULL;
	const char *slash = strrchr(o->socket, '/');
	const char *name = user;
	struct stat st;
	struct passwd pw;
	int fd, known, restricted = 0, have_policy = 0, ngroups = 0;
	gid_t *groups = NULL;
	ssize_t got;

	*deny = 0;
	if (slash == NULL || (size_t)(slash - o->socket) + sizeof POLICY_FILE + 1 > sizeof path)
		return -1;
	snprintf(path, sizeof path, "%.*s/%s", (int)(slash - o->socket), o->socket, POLICY_FILE);
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		if (o->debug)
			pam_syslog(pamh, LOG_DEBUG, "no session policy at %s: %m", path);
		return -1;
	}
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != 0 || (st.st_mode & 022) != 0 || st.st_size > MAX_POLICY) {
		pam_syslog(pamh, LOG_ERR, "%s: not a file of root's alone, or too large: ignored", path);
		close(fd);
		return -1;
	}
	data = calloc(1, (size_t)st.st_size + 1);
	if (data == NULL) {
		close(fd);
		return -1;
	}
	do
		got = read(fd, data, (size_t)st.st_size);
	while (got < 0 && errno == EINTR);
	close(fd);
	if (got != st.st_size || memchr(data, '\0', (size_t)got) != NULL) {
		pam_syslog(pamh, LOG_ERR, "%s: unreadable, or a NUL byte: ignored", path);
		free(data);
		return -1;
	}
	known = lookup_user(user, &pw, &pwbuf) == 0;
	if (known) {
		name = pw.pw_name;
		groups = user_groups(&pw, &ngroups);
	} else {
		pam_syslog(pamh, LOG_WARNING, "%s: unknown to the user database: matched by name alone", user);
	}
	for (line = data; line != NULL; line = next) {
		char *f[4];
		int n;
		next = strchr(line, '\n');
		if (next != NULL)
			*next++ = '\0';
		n = policy_fields(line, f, 3);
		if (n == 0 || f[0][0] == '#')
			continue;
		if (n == 2 && strcmp(f[0], "on_broker_down") == 0 && (strcmp(f[1], "hide") == 0 || strcmp(f[1], "deny") == 0)) {
			have_policy = 1;
			*deny = strcmp(f[1], "deny") == 0;
			continue;
		}
		if (n != 3 || (strcmp(f[0], "user") != 0 && strcmp(f[0], "group") != 0) ||
		    (strcmp(f[2], "-") != 0 && policy_id(f[2]) < 0)) {
			pam_syslog(pamh, LOG_ERR, "%s: a line not understood: ignored", path);
			have_policy = 0;
			break;
		}
		if (strcmp(f[0], "user") == 0) {
			long long uid = strcmp(f[2], "-") == 0 ? -1 : policy_id(f[2]);
			if ((known && uid == (long long)pw.pw_uid) || strcmp(f[1], name) == 0)
				restricted = 1;
		} else {
			long long gid = strcmp(f[2], "-") == 0 ? -1 : policy_id(f[2]);
			if (gid < 0) {
				struct group gr;
				char *grbuf = NULL;
				if (lookup_group(f[1], &gr, &grbuf) == 0)
					gid = (long long)gr.gr_gid;
				free(grbuf);
			}
			for (int i = 0; gid >= 0 && i < ngroups; i++)
				if ((long long)groups[i] == gid)
					restricted = 1;
		}
	}
	free(groups);
	free(data);
	if (!have_policy) {
		free(pwbuf);
		return -1;
	}
	if (known && pw.pw_uid == 0)
		restricted = 0;
	free(pwbuf);
	return restricted;
}

/* ---- the session ----------------------------------------------------- */

struct lease {
	int n;
	int fds[MAX_DEVICES];
};

static void cleanup_lease(pam_handle_t *pamh, void *data, int error_status)
{
	struct lease *l = data;
	(void)pamh;
	(void)error_status;
	close_fds(l->fds, l->n);
	free(l);
}

static void parse_args(pam_handle_t *pamh, int argc, const char **argv, struct options *o)
{
	o->socket = DEFAULT_SOCKET;
	o->timeout_ms = 2000;
	o->lease = 0;
	o->lease_services = NULL;
	o->debug = 0;
	for (int i = 0; i < argc; i++) {
		if (strncmp(argv[i], "socket=", 7) == 0 && argv[i][7] == '/') {
			o->socket = argv[i] + 7;
		} else if (strncmp(argv[i], "timeout=", 8) == 0) {
			char *end;
			double s = strtod(argv[i] + 8, &end);
			if (*end != '\0' || !(s > 0 && s <= 600))
				pam_syslog(pamh, LOG_ERR, "bad argument %s (seconds, more than 0, at most 600): using %ld ms", argv[i], o->timeout_ms);
			else
				o->timeout_ms = (long)(s * 1000 + 0.5);
		} else if (strcmp(argv[i], "lease") == 0) {
			o->lease = 1;
		} else if (strncmp(argv[i], "lease_services=", 15) == 0) {
			o->lease_services = argv[i] + 15;
		} else if (strcmp(argv[i], "debug") == 0) {
			o->debug = 1;
		} else {
			pam_syslog(pamh, LOG_ERR, "unknown argument %s (known: socket=PATH, timeout=SECONDS, lease, lease_services=SERVICE[,SERVICE...], debug)", argv[i]);
		}
	}
}

/* listed tells whether service is one of list's comma-separated names
 * (whole names: "su" is not "su-l"; empty names match nothing). */
static int listed(const char *list, const char *service)
{
	size_t n = strlen(service);
	if (list == NULL || n == 0)
		return 0;
	for (const char *p = list;;) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		if (len == n && strncmp(p, service, n) == 0)
			return 1;
		if (end == NULL)
			return 0;
		p = end + 1;
	}
}

/* say shows the broker's message, control characters (C0, DEL, and C1 as
 * UTF-8: U+0080..U+009F, which some terminals obey) replaced by '?'. */
static void say(pam_handle_t *pamh, int error, const char *msg)
{
	char clean[MAX_STRING + 1];
	size_t i = 0, j = 0;
	if (msg[0] == '\0')
		return;
	while (msg[i] != '\0' && j < MAX_STRING) {
		unsigned char c = (unsigned char)msg[i];
		if (c < 0x20 || c == 0x7f) {
			clean[j++] = '?';
			i++;
		} else if (c == 0xc2 && (unsigned char)msg[i + 1] >= 0x80 && (unsigned char)msg[i + 1] <= 0x9f) {
			clean[j++] = '?';
			i += 2;
		} else {
			clean[j++] = (char)c;
			i++;
		}
	}
	clean[j] = '\0';
	if (error)
		pam_error(pamh, "npurun: %s", clean);
	else
		pam_info(pamh, "npurun: %s", clean);
}

static int put_env(pam_handle_t *pamh, char *const *env, int n)
{
	for (int i = 0; i < n; i++) {
		int rc = pam_putenv(pamh, env[i]);
		if (rc != PAM_SUCCESS) {
			pam_syslog(pamh, LOG_ERR, "pam_putenv: %s", pam_strerror(pamh, rc));
			return rc;
		}
	}
	return PAM_SUCCESS;
}

static int hide(pam_handle_t *pamh)
{
	return put_env(pamh, (char *const *)hidden_env, (int)(sizeof hidden_env / sizeof hidden_env[0]));
}

/* keep takes a grant's descriptors for the PAM handle's life and lets the
 * session's processes inherit them, named by NPURUN_LEASE: each moved to
 * the lowest free descriptor at FIRST_LEASE_FD or above, close-on-exec
 * clear, as npurun places a lease (client.PlaceLease), so that the
 * session's login shell keeps them for what it starts. */
static int keep(pam_handle_t *pamh, struct reply *rp)
{
	char var[32 + MAX_DEVICES * 24];
	size_t n;
	struct lease *l = calloc(1, sizeof *l);
	int rc;
	if (l == NULL)
		return PAM_BUF_ERR;
	n = (size_t)snprintf(var, sizeof var, "NPURUN_LEASE=");
	for (int i = 0; i < rp->nfds; i++) {
		int fd = fcntl(rp->fds[i], F_DUPFD, FIRST_LEASE_FD); /* close-on-exec clear */
		if (fd < 0) {
			pam_syslog(pamh, LOG_ERR, "fcntl: %m");
			free(l);
			return PAM_SESSION_ERR; /* rp->fds, as far as moved, closed by the caller */
		}
		close(rp->fds[i]);
		rp->fds[i] = fd;
		n += (size_t)snprintf(var + n, sizeof var - n, "%s%d:%d", i ? "," : "", rp->devices[i], rp->fds[i]);
		l->fds[i] = rp->fds[i];
	}
	l->n = rp->nfds;
	rc = pam_set_data(pamh, DATA_NAME, l, cleanup_lease);
	if (rc != PAM_SUCCESS) {
		free(l);
		return rc;
	}
	rp->nfds = 0; /* the handle's now */
	if ((rc = put_env(pamh, rp->env, rp->nenv)) != PAM_SUCCESS)
		return rc;
	return pam_putenv(pamh, var);
}

/* obey carries out the broker's answer rp for user's session; the answer's
 * descriptors are the handle's or closed when it returns. */
static int obey(pam_handle_t *pamh, const struct options *o, const char *user, struct reply *rp)
{
	int rc;
	if (o->debug)
		pam_syslog(pamh, LOG_DEBUG, "broker: %s for %s", rp->type, user);
	if (strcmp(rp->type, "ignore") == 0) {
		rc = PAM_IGNORE;
	} else if (strcmp(rp->type, "hide") == 0) {
		rc = put_env(pamh, rp->env, rp->nenv);
		say(pamh, 0, rp->message);
	} else if (strcmp(rp->type, "grant") == 0 && o->lease) {
		rc = keep(pamh, rp);
		if (rc == PAM_SUCCESS) {
			say(pamh, 0, rp->message);
			pam_syslog(pamh, LOG_INFO, "lease of %d device(s) for %s", rp->ndevices, user);
		}
	} else if (strcmp(rp->type, "error") == 0) {
		pam_syslog(pamh, LOG_NOTICE, "session of %s refused: %s: %s", user, rp->code, rp->message);
		say(pamh, 1, rp->message);
		rc = PAM_SESSION_ERR;
	} else {
		pam_syslog(pamh, LOG_ERR, "unexpected answer %s from the broker", rp->type);
		rc = PAM_SESSION_ERR;
	}
	close_fds(rp->fds, rp->nfds);
	rp->nfds = 0;
	free_reply(rp);
	return rc;
}

PAM_EXTERN int pam_sm_open_session(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
	struct options o;
	const char *user = NULL;
	struct reply *rp;
	int rc;
	(void)flags;

	parse_args(pamh, argc, argv, &o);
	if (!o.lease && o.lease_services != NULL) {
		const void *service = NULL;
		if (pam_get_item(pamh, PAM_SERVICE, &service) == PAM_SUCCESS && service != NULL)
			o.lease = listed(o.lease_services, service);
	}
	if (pam_get_user(pamh, &user, NULL) != PAM_SUCCESS || user == NULL || user[0] == '\0') {
		pam_syslog(pamh, LOG_ERR, "no user");
		return PAM_SESSION_ERR;
	}
	if (strcmp(user, "root") == 0)
		return PAM_IGNORE; /* never restricted */
	rp = calloc(1, sizeof *rp);
	if (rp == NULL)
		return PAM_BUF_ERR;
	if (ask(pamh, &o, user, rp) != 0) {
		int deny, r = restricted_down(pamh, &o, user, &deny);
		free(rp);
		if (r <= 0) {
			if (r < 0)
				pam_syslog(pamh, LOG_WARNING, "no answer from the broker and no session policy to go by: session of %s left as it is", user);
			return PAM_IGNORE;
		}
		if (deny) {
			pam_syslog(pamh, LOG_NOTICE, "no answer from the broker: session of restricted user %s refused (on_broker_down = deny)", user);
			pam_error(pamh, "npurun: the device broker does not answer: no login for restricted accounts until it does");
			return PAM_SESSION_ERR;
		}
		pam_syslog(pamh, LOG_NOTICE, "no answer from the broker: restricted user %s logs in without a device", user);
		return hide(pamh);
	}
	rc = obey(pamh, &o, user, rp);
	free(rp);
	return rc;
}

PAM_EXTERN int pam_sm_close_session(pam_handle_t *pamh, int flags, int argc, const char **argv)
{
	const void *data = NULL;
	(void)flags;
	(void)argc;
	(void)argv;
	if (pam_get_data(pamh, DATA_NAME, &data) != PAM_SUCCESS || data == NULL)
		return PAM_IGNORE;
	/* Replacing the data runs its cleanup: the descriptors close, and the
	 * lease ends once the session's processes are gone. */
	return pam_set_data(pamh, DATA_NAME, NULL, NULL);
}
