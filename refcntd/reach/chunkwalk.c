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
 * refcntd_fastbins follows an arena's fastbin lists, which glibc.py did a link at a
 * time in Python (0.1-0.2 s of perf report's exit, 10^5 links).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/uio.h>

#define CHUNKWALK_VERSION 3

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

/* The stopped process's memory, read a window at a time into the caller's `buf`
 * (`slots` windows of `window` bytes, direct-mapped by address): a fastbin list's
 * links are mostly near each other.  tags[i]: the base of the window in slot i (1 when
 * none: no base is odd); valid[2i], valid[2i+1]: the bytes of it that were readable
 * (a heap seldom starts on a window boundary, so a window may begin before it). */
struct windows {
	int32_t pid;
	uint8_t *buf;
	uint64_t *tags;
	uint32_t *valid;
	uint64_t slots, window;
	uint64_t *stats; /* [0] system calls, [1] bytes read */
};

static int64_t vm_read(struct windows *w, void *into, uint64_t address, uint64_t size)
{
	struct iovec local = { into, size }, remote = { (void *)(uintptr_t)address, size };
	ssize_t got = process_vm_readv(w->pid, &local, 1, &remote, 1, 0);

	w->stats[0]++;
	if (got > 0)
		w->stats[1] += (uint64_t)got;
	return got;
}

/* The word at `address` (8-aligned) into *value: 0, or -1 when it cannot be read. */
static int read_word(struct windows *w, uint64_t address, uint64_t *value)
{
	uint64_t base = address - address % w->window;
	uint64_t slot = (base / w->window) % w->slots;
	uint8_t *mem = w->buf + slot * w->window;
	uint64_t at = address - base;

	if (w->tags[slot] != base) {
		uint64_t from = 0;
		int64_t got = vm_read(w, mem, base, w->window);

		if (got <= 0) { /* from the address's page on */
			from = (address & ~(uint64_t)0xfff) - base;
			got = vm_read(w, mem + from, base + from, w->window - from);
		}
		w->tags[slot] = base;
		w->valid[2 * slot] = (uint32_t)from;
		w->valid[2 * slot + 1] = (uint32_t)(from + (got > 0 ? (uint64_t)got : 0));
	}
	if (at >= w->valid[2 * slot] && at + 8 <= w->valid[2 * slot + 1]) {
		*value = *(const uint64_t *)(mem + at);
		return 0;
	}
	/* outside what the window could read: the word alone */
	return vm_read(w, value, address, 8) == 8 ? 0 : -1;
}

/* The chunks of the fastbin lists starting at heads[0..nheads), in list order, each list
 * followed for at most `per_list` links (glibc's fd is mangled: stored ^ (its own
 * address >> 12)); a chunk may be written twice (lists that meet, or a cycle: the caller
 * keeps a set).  bad[i]: the chunk of list i whose link could not be read, 0 if none.
 * Returns the chunks written, or -1 when `cap` is reached. */
int64_t refcntd_fastbins(int32_t pid, const uint64_t *heads, uint64_t nheads,
			 uint64_t per_list, uint64_t *out, uint64_t cap, uint8_t *buf,
			 uint64_t *tags, uint32_t *valid, uint64_t slots, uint64_t window,
			 uint64_t *bad, uint64_t *stats)
{
	struct windows w = { pid, buf, tags, valid, slots, window, stats };
	uint64_t n = 0;

	for (uint64_t i = 0; i < nheads; i++) {
		uint64_t chunk = heads[i], stored;

		bad[i] = 0;
		for (uint64_t k = 0; k < per_list && chunk; k++) {
			if (n == cap)
				return -1;
			out[n++] = chunk;
			if (read_word(&w, chunk + 16, &stored)) {
				bad[i] = chunk;
				break;
			}
			chunk = stored ^ ((chunk + 16) >> 12);
		}
	}
	return (int64_t)n;
}
