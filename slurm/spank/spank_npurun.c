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

/* The wire code shared with pam_npurun.c: caps, struct reply, the strict
 * reader, connect, send and receive (see its head comment). WIRE_MAX_WAIT_MS
 * is left undefined: a reply's wait_ms is read, not checked. */
#include "../../c/npurun_wire.c"

struct options {
	const char *socket;
	long timeout_ms;
	int debug;
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

/* ---- talking to the broker ------------------------------------------- */

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
	char no_answer[512];
	enum wire_fail fail;

	if (wire_send(sock, o->socket, deadline, req, strlen(req), why, whycap) != 0)
		return -1;
	snprintf(no_answer, sizeof no_answer, "no answer from the broker at %s within %ld ms", o->socket, o->timeout_ms);
	return wire_receive(sock, deadline, -1, no_answer, "plugin", rp, why, whycap, &fail);
}

/* ask connects to the broker and asks req (ask_on). */
static int ask(const struct options *o, const char *req, struct reply *rp, char *why, size_t whycap)
{
	long long deadline = now_ms() + o->timeout_ms;
	enum wire_fail fail;
	int sock, rc;

	if ((sock = wire_connect(o->socket, deadline, "no room in time", "not the broker", why, whycap, &fail)) < 0)
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
