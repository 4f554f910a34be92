/* Flush-based waiting, the pipeline of LU-style solvers: each thread owns a
 * band of rows of a grid and sweeps it column block by column block; block
 * j of a band needs block j of the band above, so thread t waits for
 * thread t-1 through a flag array and `#pragma omp flush` only (no call
 * into the runtime: GCC emits a fence), in the handshake of NPB LU's
 * sync_left/sync_right. The result is compared with a serial sweep, and
 * the program also checks the flag array is clean at the end. */
#include <omp.h>
#include <stdlib.h>

#include "check.h"

#define NI 240
#define NJ 384
#define JB 16
#define SWEEPS 3
#define MAXT 64

static long grid[NI][NJ];
static long serial[NI][NJ];
static int isync[MAXT];

static long cell(long up, long left, int i, int j, int s)
{
    return (up * 3 + left * 5 + (long)i * j + s) % 1000003;
}

static void sweep_rows(long (*a)[NJ], int lo, int hi, int j0, int j1, int s)
{
    for (int i = lo; i < hi; i++)
        for (int j = j0; j < j1; j++) {
            long up = i > 0 ? a[i - 1][j] : 7;
            long left = j > 0 ? a[i][j - 1] : 11;
            a[i][j] = cell(up, left, i, j, s);
        }
}

/* Wait until the thread above has finished the block (its flag is 1), then
 * take the flag back. */
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

/* Tell the thread below that the block is done, once it took the last
 * flag. */
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

int main(void)
{
    for (int s = 0; s < SWEEPS; s++)
        sweep_rows(serial, 0, NI, 0, NJ, s);

    int team = 0;
#pragma omp parallel
    {
        int me = omp_get_thread_num(), nt = omp_get_num_threads();
        if (nt > MAXT)
            nt = MAXT;
#pragma omp single
        team = nt;
        int lo = NI * me / nt, hi = NI * (me + 1) / nt;
        for (int s = 0; s < SWEEPS; s++) {
            for (int j0 = 0; j0 < NJ; j0 += JB) {
                sync_left(me);
                sweep_rows(grid, lo, hi, j0, j0 + JB, s);
                sync_right(me, nt);
            }
#pragma omp barrier
        }
    }
    CHECK(team >= 1, "team size");

    long sum = 0;
    int wrong = 0;
    for (int i = 0; i < NI; i++)
        for (int j = 0; j < NJ; j++) {
            sum += grid[i][j];
            wrong += grid[i][j] != serial[i][j];
        }
    CHECK(wrong == 0, "wavefront result differs from the serial sweep");
    int left = 0;
    for (int t = 0; t < MAXT; t++)
        left += isync[t];
    CHECK(left == 0, "flags left set");
    printf("wavefront: %d x %d, %d sweeps, checksum %ld, %d cells differ\n", NI, NJ,
           SWEEPS, sum, wrong);
    return finish();
}
