/* An LU-like pipeline (a reproducer of a stale read found on 4 processes,
 * from the lu benchmark kernel): every iteration
 *   r = 1 - u/2                 (omp for over planes k)
 *   lower sweep on r in place   (planes k ascending; rows j in bands by
 *                                omp for schedule(static) nowait; thread t
 *                                waits for thread t-1 by flag + flush)
 *   upper sweep on r in place   (k, j descending, same handshake)
 *   u += r                      (omp for over planes k)
 * and the result is compared with the same function run serially. Bands
 * of rows share blocks, so neighbouring processes write the same blocks
 * concurrently. Usage: ./flush_pipeline [N ITERS] (default 24 20). */
#include <omp.h>
#include <stdlib.h>

#include "check.h"

#define MAXT 64
static int isync[MAXT];
static int n, iters;
static long sx, sy;

static void sync_left(int me)
{
    if (me == 0)
        return;
    int ready;
    do {
#pragma omp flush(isync)
        ready = isync[me - 1];
    } while (ready == 0);
    isync[me - 1] = 0;
#pragma omp flush(isync)
}

static void sync_right(int me, int nt)
{
    if (me == nt - 1)
        return;
    int busy;
    do {
#pragma omp flush(isync)
        busy = isync[me];
    } while (busy == 1);
    isync[me] = 1;
#pragma omp flush(isync)
}

static void iterate(double *u, double *r)
{
    int me = omp_get_thread_num(), nt = omp_get_num_threads();
    for (int it = 0; it < iters; it++) {
#pragma omp for schedule(static)
        for (int k = 1; k <= n; k++)
            for (int j = 1; j <= n; j++)
                for (int i = 1; i <= n; i++) {
                    long p = k * sy + j * sx + i;
                    r[p] = 1.0 - 0.5 * u[p];
                }
        for (int k = 1; k <= n; k++) {
            sync_left(me);
#pragma omp for schedule(static) nowait
            for (int j = 1; j <= n; j++)
                for (int i = 1; i <= n; i++) {
                    long p = k * sy + j * sx + i;
                    r[p] = 0.5 * (r[p] + 0.25 * (r[p - 1] + r[p - sx] + r[p - sy]));
                }
            sync_right(me, nt);
        }
#pragma omp barrier
        for (int k = n; k >= 1; k--) {
            sync_left(me);
#pragma omp for schedule(static) nowait
            for (int j = n; j >= 1; j--)
                for (int i = n; i >= 1; i--) {
                    long p = k * sy + j * sx + i;
                    r[p] = 0.5 * (r[p] + 0.25 * (r[p + 1] + r[p + sx] + r[p + sy]));
                }
            sync_right(me, nt);
        }
#pragma omp barrier
#pragma omp for schedule(static)
        for (int k = 1; k <= n; k++)
            for (int j = 1; j <= n; j++)
                for (int i = 1; i <= n; i++) {
                    long p = k * sy + j * sx + i;
                    u[p] += r[p];
                }
    }
}

int main(int argc, char **argv)
{
    n = argc > 1 ? atoi(argv[1]) : 24;
    iters = argc > 2 ? atoi(argv[2]) : 20;
    sx = n + 2;
    sy = sx * (n + 2);
    long points = sy * (n + 2);
    double *u = calloc(points, sizeof *u), *r = calloc(points, sizeof *r);
    double *su = calloc(points, sizeof *su), *sr = calloc(points, sizeof *sr);
#pragma omp parallel
    iterate(u, r);
    iterate(su, sr);
    long differ = 0;
    long first = -1;
    for (long p = 0; p < points; p++)
        if (u[p] != su[p]) {
            if (first < 0)
                first = p;
            differ++;
        }
    if (first >= 0)
        printf("first differing point: k=%ld j=%ld i=%ld (%.17g, serial %.17g)\n",
               first / sy, first % sy / sx, first % sx, u[first], su[first]);
    CHECK(differ == 0, "the pipelined sweeps differ from the serial ones");
    int flags = 0;
    for (int t = 0; t < MAXT; t++)
        flags += isync[t];
    CHECK(flags == 0, "flags left set");
    printf("n=%d iters=%d differ=%ld\n", n, iters, differ);
    return finish();
}
