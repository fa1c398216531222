/* A heap of a given size for the stop-time benchmark of a live scan
 * (benchmarks/leakkinds.py): blocks of one size linked from a global list, and
 * one block in 16 dropped (lost). Prints READY, then sleeps.
 *   heapfill MIB BLOCK_BYTES [DIRTY_PERCENT]
 * DIRTY_PERCENT: a thread writes, over and over, a data word (never a pointer) of
 * blocks spread so that about that share of the heap's pages is written while a scan
 * runs (the soft-dirty pre-copy's case: only those pages are copied in the stop).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void **head;
static size_t every;

static void *writer(void *arg)
{
	(void)arg;
	for (unsigned long round = 1;; round++) {
		size_t i = 0;
		for (void **b = head; b; b = b[0], i++)
			if (i % every == 0)
				b[1] = (void *)(round << 1 | 1); /* odd: no pointer */
		usleep(1000);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	size_t total = (size_t)atol(argv[1]) << 20, block = (size_t)atol(argv[2]);
	size_t n = total / (block + 16);
	double dirty = argc > 3 ? atof(argv[3]) : 0;
	for (size_t i = 0; i < n; i++) {
		void **b = malloc(block);
		b[0] = (i % 16) ? (void *)head : NULL;
		if (i % 16)
			head = b;
	}
	if (dirty > 0) {
		/* blocks a page holds; the list skips one block in 16 */
		double per_page = 4096.0 / (double)(block + 16) * 15 / 16;
		pthread_t t;
		every = (size_t)(per_page < 1 ? 100 / dirty : per_page * 100 / dirty);
		every = every ? every : 1;
		pthread_create(&t, NULL, writer, NULL);
	}
	printf("READY %zu\n", n);
	fflush(stdout);
	for (;;)
		pause();
}
