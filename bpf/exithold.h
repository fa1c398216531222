/* Holding a traced process at its exit for a reachability scan (refcntd/reach/).
 *
 * The leak kinds of valgrind and LeakSanitizer need the memory as it is once
 * atexit handlers and destructors have run and before it goes: the
 * sched_process_exit tracepoint comes after exit_mm, too late.  A uprobe on
 * libc's _exit (which exit() calls last, and which makes the exit_group system
 * call) stops the process there, recorded in `held` (hold.h) under the key
 * EXIT_HOLD_OFFSET: user space scans it, then continues it, and the guardian
 * continues it if refcntd dies first.  Only a process `held` has room for is
 * stopped: never a stop nobody will see; and only one that has had a tracked
 * object (PROC_HAS_OBJECTS): the shells and tools around a test are not stopped.  Attached only where processes are
 * filtered (run, attach --pid) or scoped to a program (serve, filter_exe): system-wide
 * every process on the host would stop.
 */
#ifndef REFCNTD_EXITHOLD_H
#define REFCNTD_EXITHOLD_H

#define EXIT_HOLD_OFFSET 0xffffffffffffffffULL  /* a hold_key no module offset can be */

int on_exit_hold(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	struct proc_val *proc = procs.lookup(&tgid);
	/* a process that never had a tracked object has nothing to classify: not stopped */
	if ((!KNOB(filtered) && !KNOB(filter_exe)) || !proc || !(proc->flags & PROC_HAS_OBJECTS))
		return 0;
	struct hold_key why = {.offset = EXIT_HOLD_OFFSET};
	if (held.update(&tgid, &why) != 0)
		return 0;
	struct event *ev = event_new(EV_HOLD, tgid, (__u32)bpf_get_current_pid_tgid(), 0);
	if (ev)
		event_emit(ev);
	bpf_send_signal(SIGSTOP);
	return 0;
}

#endif
