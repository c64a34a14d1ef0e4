/* compute — the worker threads that run a step's heavy loops (products, attention).
 *
 * Why not OpenMP: libgomp's workers spin at every barrier, and its spin policy can only be
 * set through the environment before the library loads. On a 2-core machine that is also
 * running the HTTP loop, a client or a neighbour, a spinning barrier waits for a
 * descheduled partner: decode measured 7x slower with spinning than without. This pool
 * spins only briefly, then sleeps; and work is claimed item by item from a shared
 * counter, so the caller finishes whatever a descheduled worker has not started.
 *
 * One process-wide pool. The calling thread works too; n_threads counts it. Calls from
 * several threads at once are serialised.
 */
#ifndef PAGEDSERVE_COMPUTE_H
#define PAGEDSERVE_COMPUTE_H

/* Start (or resize) the pool: n_threads <= 0 means one per core. Returns the count in use. */
int compute_init(int n_threads);
/* Threads a parallel loop uses now (1 before compute_init). */
int compute_threads(void);
/* Stop the workers (the pool can be started again). */
void compute_shutdown(void);

/* fn(ctx, item, thread) for every item in [0, n_items), spread over the pool; returns when
 * all are done. thread is in [0, compute_threads()) and unique among concurrent calls, for
 * per-thread scratch. Items are claimed one at a time: make each worth a few microseconds.
 * fn must not call compute_* itself: the pool is not reentrant (a nested loop deadlocks).
 * fn may use a few hundred KiB of stack (attention's items keep ~140 KiB of tiles and
 * states there): workers get the default pthread stack (8 MiB on Linux), and so must the
 * calling thread (the engine's thread is created with the default too). */
typedef void (*ComputeFn)(void *ctx, int item, int thread);
void compute_parallel_for(int n_items, ComputeFn fn, void *ctx);

/* fn(ctx, lo, hi, thread) over [0, n) cut into ranges of per_item (the last one shorter),
 * spread over the pool like compute_parallel_for; `parallel` 0 runs the whole of [0, n)
 * as one range on the calling thread. Rows of a matrix, panels of a product. */
typedef void (*ComputeRangeFn)(void *ctx, int lo, int hi, int thread);
void compute_parallel_ranges(int n, int per_item, int parallel, ComputeRangeFn fn, void *ctx);

#endif
