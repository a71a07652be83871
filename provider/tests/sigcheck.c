/* A C check that the threads softhca's libraries start take no signal of the program's
 * (tests/native/test_threads.py). A program that blocks a signal in its own threads
 * and sends it to itself (tgtd does, with SIGUSR2) expects it to stay pending until a
 * thread of its own takes it; a library thread with that signal unblocked would take
 * it instead, and the program's handler (or the default action: death) would run
 * there.
 *
 * It opens the first verbs device and makes an rdma_cm event channel and id (the
 * provider's and librdmacm's reader threads start), blocks SIGUSR2 in main and
 * installs a handler for it, then prints, for every thread but main, its SigBlk from
 * /proc/self/task/TID/status against the mask of a thread of its own started with
 * every signal blocked (pthread_sigmask(3) with sigfillset: what a full mask reads
 * as, less SIGKILL, SIGSTOP and the C library's own signals):
 *
 *   thread TID SigBlk HEX full|NOT-FULL (missing HEX)
 *   threads N
 *   SIGUSR2 pending, handler ran 0 times
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

static volatile sig_atomic_t handled;
static pthread_mutex_t ref_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ref_cond = PTHREAD_COND_INITIALIZER;
static int ref_tid, ref_done;

static void on_usr2(int sig)
{
	(void)sig;
	handled++;
}

static void die(const char *what)
{
	printf("FAIL %s: %s\n", what, strerror(errno));
	exit(1);
}

static unsigned long long sigblk(int tid)
{
	char path[64], line[256];
	unsigned long long v = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/self/task/%d/status", tid);
	f = fopen(path, "r");
	if (!f)
		die(path);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "SigBlk: %llx", &v) == 1)
			break;
	fclose(f);
	return v;
}

/* The reference: a thread that blocks every signal itself, then waits to be read. */
static void *ref_main(void *arg)
{
	sigset_t all;

	(void)arg;
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, NULL);
	pthread_mutex_lock(&ref_lock);
	ref_tid = gettid();
	pthread_cond_broadcast(&ref_cond);
	while (!ref_done)
		pthread_cond_wait(&ref_cond, &ref_lock);
	pthread_mutex_unlock(&ref_lock);
	return NULL;
}

int main(void)
{
	struct sigaction sa = {.sa_handler = on_usr2};
	struct rdma_event_channel *ch;
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct rdma_cm_id *id;
	unsigned long long full, v;
	sigset_t usr2, pending;
	struct timespec ms200 = {0, 200 * 1000 * 1000};
	struct dirent *d;
	pthread_t ref;
	DIR *dir;
	int n, tid, threads = 0;

	setvbuf(stdout, NULL, _IOLBF, 0);
	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("ibv_get_device_list");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device");
	ch = rdma_create_event_channel();
	if (!ch)
		die("rdma_create_event_channel");
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	/* Blocked in main only after the libraries' threads started: they do not inherit
	 * it from main, as a program's threads that block it later do not give it to them. */
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	if (pthread_sigmask(SIG_BLOCK, &usr2, NULL) || sigaction(SIGUSR2, &sa, NULL))
		die("SIGUSR2");

	if (pthread_create(&ref, NULL, ref_main, NULL))
		die("pthread_create");
	pthread_mutex_lock(&ref_lock);
	while (!ref_tid)
		pthread_cond_wait(&ref_cond, &ref_lock);
	pthread_mutex_unlock(&ref_lock);
	full = sigblk(ref_tid);

	dir = opendir("/proc/self/task");
	if (!dir)
		die("/proc/self/task");
	while ((d = readdir(dir))) {
		tid = atoi(d->d_name);
		if (tid <= 0 || tid == getpid() || tid == ref_tid)
			continue;
		v = sigblk(tid);
		threads++;
		if ((v & full) == full)
			printf("thread %d SigBlk %016llx full\n", tid, v);
		else
			printf("thread %d SigBlk %016llx NOT-FULL (missing %016llx)\n", tid, v,
			       full & ~v);
	}
	closedir(dir);
	printf("threads %d\n", threads);

	/* Sent to the process: only a thread with SIGUSR2 unblocked may take it. */
	kill(getpid(), SIGUSR2);
	nanosleep(&ms200, NULL);
	sigpending(&pending);
	printf("SIGUSR2 %s, handler ran %d times\n",
	       sigismember(&pending, SIGUSR2) ? "pending" : "not pending", (int)handled);

	pthread_mutex_lock(&ref_lock);
	ref_done = 1;
	pthread_cond_broadcast(&ref_cond);
	pthread_mutex_unlock(&ref_lock);
	pthread_join(ref, NULL);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
