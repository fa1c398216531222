/* The ring buffer to user space: process lifecycle events and anomalies, in
 * order (a process's exit after all of its events).  Nothing is sent per get
 * or put: those are aggregated in the kernel.
 */
#ifndef REFCNTD_EVENTS_H
#define REFCNTD_EVENTS_H

#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 1024
#endif
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);  /* 4 MiB: bursts of short-lived processes */
BPF_PERCPU_ARRAY(scratch, struct event, 1);

static __always_inline void event_emit(struct event *ev)
{
	if (events.ringbuf_output(ev, sizeof(*ev), 0) != 0)
		stat_count(ST_EVENT_LOST);
}

/* The CPU's scratch event, filled for this process and thread. */
static __always_inline struct event *event_new(__u32 kind, __u32 tgid, __u32 pid, __u32 gen)
{
	int zero = 0;
	struct event *ev = scratch.lookup(&zero);
	if (!ev)
		return 0;
	ev->kind = kind;
	ev->tgid = tgid;
	ev->pid = pid;
	ev->gen = gen;
	ev->ts = bpf_ktime_get_ns();
	ev->exit_code = -1;
	ev->argc = 0;
	ev->path[0] = 0;
	bpf_get_current_comm(ev->comm, sizeof(ev->comm));
	return ev;
}

#endif
