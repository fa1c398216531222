/* A heap of a given size for the stop-time benchmark of a live scan
 * (benchmarks/leakkinds.py): blocks of one size linked from a global list, and
 * one block in 16 dropped (lost). Prints READY, then sleeps.
 *   heapfill MIB BLOCK_BYTES
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

void **head;

int main(int argc, char **argv)
{
	size_t total = (size_t)atol(argv[1]) << 20, block = (size_t)atol(argv[2]);
	size_t n = total / (block + 16);
	for (size_t i = 0; i < n; i++) {
		void **b = malloc(block);
		b[0] = (i % 16) ? (void *)head : NULL;
		if (i % 16)
			head = b;
	}
	printf("READY %zu\n", n);
	fflush(stdout);
	for (;;)
		pause();
}
