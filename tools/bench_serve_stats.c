/* bench_serve_stats — growable arrays of samples and their percentiles. */
#include "tools/bench_serve_internal.h"

#include <math.h>
#include <stdlib.h>

int bs_samples_push(BsSamples *s, double x)
{
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 64;
        double *nv = realloc(s->v, ncap * sizeof *nv);
        if (nv == NULL)
            return -1;
        s->v = nv;
        s->cap = ncap;
    }
    s->v[s->n++] = x;
    return 0;
}

void bs_samples_free(BsSamples *s)
{
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void bs_samples_sort(BsSamples *s)
{
    if (s->n > 1)
        qsort(s->v, s->n, sizeof *s->v, cmp_double);
}

double bs_percentile(const BsSamples *sorted, double q)
{
    if (sorted->n == 0)
        return NAN;
    if (q <= 0)
        return sorted->v[0];
    if (q >= 1)
        return sorted->v[sorted->n - 1];
    double rank = q * (double)(sorted->n - 1);
    size_t lo = (size_t)rank;
    double frac = rank - (double)lo;
    if (lo + 1 >= sorted->n)
        return sorted->v[lo];
    return sorted->v[lo] + frac * (sorted->v[lo + 1] - sorted->v[lo]);
}

double bs_mean(const BsSamples *s)
{
    if (s->n == 0)
        return NAN;
    double sum = 0;
    for (size_t i = 0; i < s->n; i++)
        sum += s->v[i];
    return sum / (double)s->n;
}
