/* The uprobe floor: a program that does nothing, attached where refcntd's
 * probe would go.  Loaded by benchmarks/run.py, never by refcntd. */
int on_probe(void *ctx)
{
	return 0;
}
