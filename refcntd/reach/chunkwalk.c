/* glibc malloc's chunk chain followed one header at a time: a linked walk numpy
 * cannot vectorise (refcntd/reach/chunks.py does it in rounds of numpy passes, about
 * 0.5 us a chunk; this is a few ns).  Built by scripts/setup.sh into _chunkwalk.so,
 * loaded with ctypes by chunks.py, which keeps the numpy walk where it is missing.
 *
 * refcntd_chunkwalk walks the chunks whose header lies in one window of words read from the
 * stopped process, with the same checks as chunks.py: a size of at least 32, bit 3
 * clear, the chunk inside the region.  Nothing is allocated; it writes only into the
 * caller's arrays, at most `cap` chunks.  refcntd_pointers keeps the words of a window
 * that may point into a block, in one pass instead of numpy's several.
 */
#include <stdint.h>

#define CHUNKWALK_VERSION 2

int refcntd_chunkwalk_version(void)
{
	return CHUNKWALK_VERSION;
}

/* words: the window, `slots` 16-byte slots starting at `base` (a chunk header);
 * end: where the region ends.  Writes each chunk's address, size and own PREV_INUSE
 * bit; *after: where the chunk after the last one starts; *broken: 1 when that one is
 * inside the window and no header.  Returns the chunks written, or -1 when the first
 * slot is no header (or cap is reached: the caller sizes cap to the window). */
int64_t refcntd_chunkwalk(const uint64_t *words, uint64_t slots, uint64_t base,
			  uint64_t end, uint64_t *addr, uint64_t *size,
			  uint8_t *prev_inuse, uint64_t cap, uint64_t *after,
			  int32_t *broken)
{
	uint64_t slot = 0, n = 0;

	*broken = 0;
	while (slot < slots) {
		uint64_t raw = words[2 * slot + 1];
		uint64_t bytes = raw & ~(uint64_t)7;
		uint64_t at = base + 16 * slot;

		if (raw < 32 || (raw & 8) || bytes > end - at) {
			*broken = 1;
			break;
		}
		if (n == cap)
			return -1;
		addr[n] = at;
		size[n] = bytes;
		prev_inuse[n] = raw & 1;
		n++;
		slot += bytes >> 4;
	}
	*after = base + 16 * slot;
	return n ? (int64_t)n : -1;
}

/* The words in [lo, hi) of `count` words read at `base`: their values and addresses,
 * in order (at most `count`: the caller's arrays are that long).  Returns how many. */
int64_t refcntd_pointers(const uint64_t *words, uint64_t count, uint64_t base,
			 uint64_t lo, uint64_t hi, uint64_t *values, uint64_t *where)
{
	uint64_t n = 0;

	for (uint64_t i = 0; i < count; i++) {
		uint64_t v = words[i];

		if (v - lo < hi - lo) { /* lo <= v < hi, one compare */
			values[n] = v;
			where[n] = base + 8 * i;
			n++;
		}
	}
	return (int64_t)n;
}
