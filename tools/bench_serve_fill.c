/* bench_serve_fill — KV slot fill across a level's /metrics polls (see bench_serve_internal.h).
 *
 * Polls are samples of a moving server, so "the fill at peak use" means the fill reported
 * by the same scrape that reported the highest KV usage: the two gauges come from one
 * end-of-step snapshot, never from different moments. */
#include "tools/bench_serve_internal.h"

#include <math.h>

void bs_fill_track_init(BsFillTrack *t)
{
    t->peak_kv_usage = t->fill_at_peak = t->min_fill = NAN;
}

static void keep_lower(double *kept, double v)
{
    if (!isnan(v) && (isnan(*kept) || v < *kept))
        *kept = v;
}

void bs_fill_track_add(BsFillTrack *t, double kv_usage, double running, double fill)
{
    if (!isnan(kv_usage)) {
        if (isnan(t->peak_kv_usage) || kv_usage > t->peak_kv_usage) {
            t->peak_kv_usage = kv_usage;
            t->fill_at_peak = fill;
        } else if (kv_usage == t->peak_kv_usage) {
            keep_lower(&t->fill_at_peak, fill);
        }
    }
    /* An idle server reports 1 (nothing wasted): only polls with work say something. */
    if (running > 0)
        keep_lower(&t->min_fill, fill);
}
