/* A small perf-like program: dsos, maps and threads, reference counted with
 * the refcnt stubs, with two known bugs.
 *
 *  1. sample__resolve_kernel() returns early without map__put() for kernel
 *     samples (every 10th of N samples, N >= 10, default 100).
 *  2. machine__process_fork() takes a reference on thread 2 it never drops.
 *
 * Known truth at exit (what refcntd must report), for N samples:
 *  - thread: 1 leaked (tid 2, count 1), allocated in thread__new
 *  - map:    4 leaked, allocated in map__new: thread 1's kernel map with
 *            count ceil(N/10) (bug 1) and thread 2's three maps, count 1
 *            each (held by the leaked thread)
 *  - dso:    3 leaked, allocated in dso__new: "[kernel.kallsyms]" count 2
 *            (both kernel maps), "perf" and "libc.so.6" count 1
 *  - comm:   N created, none leaked
 * 8 objects of 3 types in all.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "refcnt.h"

#define NOINLINE __attribute__((noinline))

struct dso { atomic_t refcnt; char name[32]; };
struct map { atomic_t refcnt; struct dso *dso; unsigned long start, end; };
struct thread { atomic_t refcnt; int tid; struct map *maps[3]; };
struct comm { atomic_t refcnt; char str[16]; };

NOINLINE struct dso *dso__new(const char *name)
{
	struct dso *dso = calloc(1, sizeof(*dso));
	strncpy(dso->name, name, sizeof(dso->name) - 1);
	refcnt__init(dso, refcnt, 1);
	return dso;
}

NOINLINE struct dso *dso__get(struct dso *dso) { refcnt__get(dso, refcnt); return dso; }

NOINLINE void dso__put(struct dso *dso)
{
	if (dso && refcnt__put(dso, refcnt)) {
		refcnt__exit(dso, refcnt);
		free(dso);
	}
}

NOINLINE struct map *map__new(struct dso *dso, unsigned long start, unsigned long end)
{
	struct map *map = calloc(1, sizeof(*map));
	map->dso = dso__get(dso);
	map->start = start;
	map->end = end;
	refcnt__init(map, refcnt, 1);
	return map;
}

NOINLINE struct map *map__get(struct map *map) { refcnt__get(map, refcnt); return map; }

NOINLINE void map__put(struct map *map)
{
	if (map && refcnt__put(map, refcnt)) {
		dso__put(map->dso);
		refcnt__exit(map, refcnt);
		free(map);
	}
}

NOINLINE struct thread *thread__new(int tid)
{
	struct thread *thread = calloc(1, sizeof(*thread));
	thread->tid = tid;
	refcnt__init(thread, refcnt, 1);
	return thread;
}

NOINLINE struct thread *thread__get(struct thread *t) { refcnt__get(t, refcnt); return t; }

NOINLINE void thread__put(struct thread *thread)
{
	if (thread && refcnt__put(thread, refcnt)) {
		for (int i = 0; i < 3; i++)
			map__put(thread->maps[i]);
		refcnt__exit(thread, refcnt);
		free(thread);
	}
}

NOINLINE struct comm *comm__new(int tid)
{
	struct comm *comm = calloc(1, sizeof(*comm));
	snprintf(comm->str, sizeof(comm->str), "worker-%d", tid);
	refcnt__init(comm, refcnt, 1);
	return comm;
}

NOINLINE void comm__put(struct comm *comm)
{
	if (refcnt__put(comm, refcnt)) {
		refcnt__exit(comm, refcnt);
		free(comm);
	}
}

struct machine { struct dso *dsos[3]; struct thread *threads[2]; };

NOINLINE void machine__create_kernel_maps(struct machine *m, struct thread *t)
{
	t->maps[0] = map__new(m->dsos[0], 0xffffffff81000000ul, 0xffffffff82000000ul);
}

NOINLINE void machine__init(struct machine *m)
{
	m->dsos[0] = dso__new("[kernel.kallsyms]");
	m->dsos[1] = dso__new("perf");
	m->dsos[2] = dso__new("libc.so.6");
	for (int i = 0; i < 2; i++) {
		struct thread *t = thread__new(i + 1);
		machine__create_kernel_maps(m, t);
		t->maps[1] = map__new(m->dsos[1], 0x400000, 0x500000);
		t->maps[2] = map__new(m->dsos[2], 0x7f0000000000ul, 0x7f0000200000ul);
		m->threads[i] = t;
	}
	/* the threads now hold the dsos through their maps */
	for (int i = 0; i < 3; i++)
		dso__put(m->dsos[i]);
}

NOINLINE struct map *thread__find_map(struct thread *t, unsigned long addr)
{
	for (int i = 0; i < 3; i++)
		if (addr >= t->maps[i]->start && addr < t->maps[i]->end)
			return map__get(t->maps[i]);
	return NULL;
}

NOINLINE int sample__resolve_kernel(struct thread *t, unsigned long addr)
{
	struct map *map = thread__find_map(t, addr);
	if (!map)
		return -1;
	if (map->dso->name[0] == '[')
		return 1;  /* BUG: returns without map__put() */
	map__put(map);
	return 0;
}

NOINLINE int sample__resolve_user(struct thread *t, unsigned long addr)
{
	struct map *map = thread__find_map(t, addr);
	if (!map)
		return -1;
	map__put(map);
	return 0;
}

NOINLINE void machine__process_fork(struct machine *m)
{
	struct thread *child = thread__get(m->threads[1]);  /* BUG: never put */
	(void)child;
}

NOINLINE unsigned long process_samples(struct machine *m, int n)
{
	unsigned long resolved = 0;
	for (int i = 0; i < n; i++) {
		struct thread *t = thread__get(m->threads[0]);
		struct comm *comm = comm__new(t->tid);
		if (i % 10 == 0)
			resolved += sample__resolve_kernel(t, 0xffffffff81001000ul + i) == 1;
		else
			resolved += sample__resolve_user(t, i % 2 ? 0x401000 : 0x7f0000001000ul) == 0;
		comm__put(comm);
		thread__put(t);
	}
	return resolved;
}

NOINLINE void machine__exit(struct machine *m)
{
	for (int i = 0; i < 2; i++)
		thread__put(m->threads[i]);
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 100;
	/* on the heap, freed at the end as perf's machine__delete: nothing else holds a leak */
	struct machine *m = calloc(1, sizeof(*m));
	machine__init(m);
	machine__process_fork(m);
	unsigned long resolved = process_samples(m, n);
	machine__exit(m);
	free(m);
	printf("perflike: %d samples, %lu resolved\n", n, resolved);
	return 0;
}
