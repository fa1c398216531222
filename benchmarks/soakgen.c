/* The soak's workload (benchmarks/soak.py): short-lived processes that each leak
 * a known set of objects and print that truth, and one long-running service.
 *
 *   soakgen once SEED      leak per SEED, print the truth, exit
 *   soakgen fork SEED      fork first; parent and child each leak per their own
 *                          seed and print their own truth (nothing is inherited)
 *   soakgen exec SEED      leak per SEED, then exec `soakgen once SEED+1 N...`
 *                          carrying what it leaked: the final line is the whole
 *                          process's truth (objects outlive an exec in refcntd)
 *   soakgen kill SEED      leak per SEED, print the truth, then wait to be killed
 *   soakgen svc            a service: each line N on stdin runs N requests, each
 *                          leaking one `conn`; answers "ok N" (total leaked)
 *
 * A truth line: "TRUTH pid=P conn=a,b req=c buf=" (the final counts of the
 * leaked objects of each type, sorted).  -DSOAK_BUILD=N changes the build-id. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "refcnt.h"

#ifndef SOAK_BUILD
#define SOAK_BUILD 0
#endif
__attribute__((used)) const int soak_build = SOAK_BUILD;

#define NTYPES 3
#define MAXLEAK 64
static const char *const TYPES[NTYPES] = {"conn", "req", "buf"};

struct obj { atomic_t refcnt; int type; char payload[40]; };

/* counts of leaked objects per type, for the truth line */
static int leaked[NTYPES][MAXLEAK];
static int nleaked[NTYPES];

__attribute__((noinline)) static struct obj *obj_new(int type)
{
	struct obj *o = calloc(1, sizeof(*o));
	o->type = type;
	__refcnt__init(&o->refcnt, 1, o, TYPES[type]);
	return o;
}

__attribute__((noinline)) static void obj_get(struct obj *o)
{
	__refcnt__get(&o->refcnt, o, TYPES[o->type]);
}

__attribute__((noinline)) static void obj_put(struct obj *o)
{
	if (__refcnt__put(&o->refcnt, o, TYPES[o->type])) {
		refcnt__delete(o);
		free(o);
	}
}

/* One unit of work: an object used and released, or (leak) one kept with
 * `extra` more references, recorded in the truth. */
__attribute__((noinline)) static void work(int type, int leak, int extra)
{
	struct obj *o = obj_new(type);
	obj_get(o);
	obj_put(o);
	for (int i = 0; i < extra; i++)
		obj_get(o);
	if (!leak) {
		for (int i = 0; i < extra; i++)
			obj_put(o);
		obj_put(o);
		return;
	}
	if (nleaked[type] < MAXLEAK)
		leaked[type][nleaked[type]++] = 1 + extra;
}

static unsigned next(unsigned *s)
{
	*s = *s * 1103515245u + 12345u;
	return (*s >> 16) & 0x7fff;
}

/* 10-40 units, 0-5 of them leaks, by seed */
static void run_seed(unsigned seed)
{
	unsigned s = seed;
	int units = 10 + next(&s) % 31, leaks = next(&s) % 6;
	for (int i = 0; i < units; i++) {
		int type = next(&s) % NTYPES;
		work(type, i < leaks, next(&s) % 3);
	}
}

static int cmp(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

static void print_truth(void)
{
	printf("TRUTH pid=%d", (int)getpid());
	for (int t = 0; t < NTYPES; t++) {
		qsort(leaked[t], nleaked[t], sizeof(int), cmp);
		printf(" %s=", TYPES[t]);
		for (int i = 0; i < nleaked[t]; i++)
			printf(i ? ",%d" : "%d", leaked[t][i]);
	}
	printf("\n");
	fflush(stdout);
}

/* exec: the leaks so far travel in argv as "type:count" words */
static void exec_self(const char *self, unsigned seed)
{
	char *argv[3 + NTYPES * MAXLEAK + 1], words[NTYPES * MAXLEAK][16], seedbuf[16];
	int n = 0;
	snprintf(seedbuf, sizeof(seedbuf), "%u", seed + 1);
	argv[n++] = (char *)self;
	argv[n++] = "once";
	argv[n++] = seedbuf;
	for (int t = 0; t < NTYPES; t++)
		for (int i = 0; i < nleaked[t]; i++) {
			snprintf(words[n - 3], sizeof(words[0]), "%d:%d", t, leaked[t][i]);
			argv[n] = words[n - 3];
			n++;
		}
	argv[n] = NULL;
	execv("/proc/self/exe", argv);
	perror("execv");
	_exit(127);
}

static void inherit(int argc, char **argv)
{
	for (int i = 3; i < argc; i++) {
		int t, c;
		if (sscanf(argv[i], "%d:%d", &t, &c) == 2 && t >= 0 && t < NTYPES &&
		    nleaked[t] < MAXLEAK)
			leaked[t][nleaked[t]++] = c;
	}
}

static int service(void)
{
	long total = 0, n;
	char line[64];
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		n = strtol(line, NULL, 10);
		for (long i = 0; i < n; i++) {
			struct obj *o = obj_new(0);  /* a request: one balanced, one kept */
			work(1, 0, 1);
			obj_get(o);
			obj_put(o);
			total++;
		}
		printf("ok %ld\n", total);
	}
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	if (strcmp(argv[1], "svc") == 0)
		return service();
	if (argc < 3)
		return 2;
	unsigned seed = (unsigned)strtoul(argv[2], NULL, 10);
	if (strcmp(argv[1], "fork") == 0) {
		pid_t child = fork();
		run_seed(child == 0 ? seed ^ 0x5a5a : seed);
		print_truth();
		if (child == 0)
			_exit(0);
		waitpid(child, NULL, 0);
		return 0;
	}
	inherit(argc, argv);
	run_seed(seed);
	if (strcmp(argv[1], "exec") == 0)
		exec_self(argv[0], seed);
	print_truth();
	if (strcmp(argv[1], "kill") == 0)
		for (;;)
			pause();
	return 0;
}
