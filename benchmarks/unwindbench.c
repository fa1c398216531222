/* init+release pairs with the allocation stack DEPTH frames deep, timed inside
 * the program (CLOCK_MONOTONIC).  Built twice by benchmarks/unwind.py: with
 * frame pointers and without (-fomit-frame-pointer), to compare the
 * frame-pointer walk with the CFI walk over the same depth.
 *
 *   unwindbench DEPTH N    prints "ns <ns per init+release pair>"
 *
 * DEPTH counts every frame from the stub to _start: the stub, pairs(),
 * level() x (DEPTH - 6), main, two libc frames and _start. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "refcnt.h"

struct obj { atomic_t refcnt; long pad[3]; };

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static struct obj leaked;  /* one object leaked at the same depth: its stack is reported */

__attribute__((noinline)) static double pairs(long n)
{
	struct obj o = {0};
	double start = now_ns();
	for (long i = 0; i < n; i++) {
		refcnt__init(&o, refcnt, 1);
		if (refcnt__put(&o, refcnt))
			refcnt__delete(&o);
	}
	double ns = (now_ns() - start) / n;
	refcnt__init(&leaked, refcnt, 1);
	return ns;
}

__attribute__((noinline)) static double level(int depth, long n)
{
	double ns = depth > 0 ? level(depth - 1, n) : pairs(n);
	__asm__ volatile("" ::: "memory");  /* no tail call: one frame per level */
	return ns;
}

int main(int argc, char **argv)
{
	int depth = argc > 1 ? atoi(argv[1]) : 8;
	long n = argc > 2 ? atol(argv[2]) : 100000;
	printf("ns %.1f\n", level(depth > 6 ? depth - 7 : 0, n));
	return 0;
}
