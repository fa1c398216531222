/* Workloads for the benchmarks, timed inside the program (CLOCK_MONOTONIC).
 *
 *   bench getput N       one object, N get+put pairs: ns per call
 *   bench churn N        N init+release pairs (an allocation stack each): ns per pair
 *   bench malloc N       N malloc+free pairs (what bcc memleak traces): ns per call
 *   bench threads N      2 threads, N get+put pairs each on 4 shared objects; prints
 *                        ns per call and the final counts (expected: 1 each)
 *   bench live N         N live objects, then exit: prints the exit time (CLOCK_REALTIME)
 *   bench usdt N         N get+put pairs marked by semaphore-gated USDT probes
 * With "wait" as last argument it prints "ready" and waits for a line first (so a
 * tracer attached by pid sees the whole loop). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "refcnt.h"
#ifdef WITH_USDT
#include "benchprobes.h"
#endif

struct obj { atomic_t refcnt; long pad[3]; };
static long n_iter;

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static struct obj *obj_new(void)
{
	struct obj *o = calloc(1, sizeof(*o));
	refcnt__init(o, refcnt, 1);
	return o;
}

static double getput(void)
{
	struct obj *o = obj_new();
	double t0 = now_ns();
	for (long i = 0; i < n_iter; i++) {
		refcnt__get(o, refcnt);
		refcnt__put(o, refcnt);
	}
	return (now_ns() - t0) / (2.0 * n_iter);
}

static double churn(void)
{
	double t0 = now_ns();
	for (long i = 0; i < n_iter; i++) {
		struct obj *o = obj_new();
		if (refcnt__put(o, refcnt))
			refcnt__exit(o, refcnt);
		free(o);
	}
	return (now_ns() - t0) / n_iter;
}

static double mallocs(void)
{
	double t0 = now_ns();
	for (long i = 0; i < n_iter; i++) {
		void *volatile p = malloc(48);
		free(p);
	}
	return (now_ns() - t0) / (2.0 * n_iter);
}

static struct obj *shared[4];

static void *worker(void *arg)
{
	(void)arg;
	for (long i = 0; i < n_iter; i++) {
		struct obj *o = shared[i & 3];
		refcnt__get(o, refcnt);
		refcnt__put(o, refcnt);
	}
	return NULL;
}

static double threads(void)
{
	pthread_t th[2];
	for (int i = 0; i < 4; i++)
		shared[i] = obj_new();
	double t0 = now_ns();
	for (int i = 0; i < 2; i++)
		pthread_create(&th[i], NULL, worker, NULL);
	for (int i = 0; i < 2; i++)
		pthread_join(th[i], NULL);
	double ns = (now_ns() - t0) / (4.0 * n_iter);
	printf("counts %d %d %d %d\n", shared[0]->refcnt.counter, shared[1]->refcnt.counter,
	       shared[2]->refcnt.counter, shared[3]->refcnt.counter);
	return ns;
}

static double live(void)
{
	for (long i = 0; i < n_iter; i++)
		obj_new();
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	printf("exit_at %.6f\n", ts.tv_sec + ts.tv_nsec / 1e9);
	return 0;
}

#ifdef WITH_USDT
static double usdt(void)
{
	struct obj *o = obj_new();
	double t0 = now_ns();
	for (long i = 0; i < n_iter; i++) {
		__atomic_add_fetch(&o->refcnt.counter, 1, __ATOMIC_SEQ_CST);
		if (BENCH_GET_ENABLED())
			BENCH_GET(o);
		if (BENCH_PUT_ENABLED())
			BENCH_PUT(o);
		__atomic_sub_fetch(&o->refcnt.counter, 1, __ATOMIC_SEQ_CST);
	}
	return (now_ns() - t0) / (2.0 * n_iter);
}
#endif

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	n_iter = atol(argv[2]);
	if (strcmp(argv[argc - 1], "wait") == 0) {
		char line[8];
		printf("ready\n");
		fflush(stdout);
		if (!fgets(line, sizeof(line), stdin))
			return 1;
	}
	double ns = -1;
	if (!strcmp(argv[1], "getput")) ns = getput();
	else if (!strcmp(argv[1], "churn")) ns = churn();
	else if (!strcmp(argv[1], "malloc")) ns = mallocs();
	else if (!strcmp(argv[1], "threads")) ns = threads();
	else if (!strcmp(argv[1], "live")) ns = live();
#ifdef WITH_USDT
	else if (!strcmp(argv[1], "usdt")) ns = usdt();
#endif
	printf("ns %.2f\n", ns);
	return 0;
}
