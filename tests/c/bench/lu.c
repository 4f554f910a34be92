/* LU-like kernel (the SSOR solver of the NAS Parallel Benchmarks' LU):
 * symmetric successive over-relaxation for a 3-D 7-point problem
 * A u = f on an nx x ny x nz grid (zero boundary), A u = d u minus the six
 * neighbours weighted by different coefficients below and above
 * (non-symmetric, like a convection term), f pseudo-random in [0, 1).
 *
 * Every iteration: the residual r = f - A u and its squared norm (a `for`
 * loop over k with reduction(+: ...)); the lower triangular sweep
 * r <- (D - wL)^-1 w r and the upper one r <- (D - wU)^-1 (2 - w) D r, both
 * in place, so each point needs its already updated neighbours below (or
 * above) in i, j and k; then u += r (a `for` loop).
 *
 * The sweeps are pipelined as in the OpenMP LU codes: the planes k are
 * taken in order by every thread, and in each plane a `for` loop with
 * schedule(static) nowait over j gives each thread its band of rows. A
 * thread's first row needs the last row of the band before it in the same
 * plane, so before a plane a thread waits for the previous thread's flag
 * (sync_left) and after it raises its own (sync_right), a handshake of a
 * shared flag array and `#pragma omp flush` only: the consumer spins,
 * flushing, until the flag is set, clears it and flushes; the producer
 * spins, flushing, until its last flag was taken, sets it and flushes. The
 * upper sweep runs its loops backwards (k and j descending): with the
 * static schedule thread 0 then has the top band, so the same handshake
 * serves. One parallel region for all the iterations.
 *
 * Verified against the same iterations run serially (the same function
 * called outside any parallel region, where the handshake does nothing):
 * every point is computed by the same expression in the same order, so u
 * must be identical bit for bit, and every iteration's residual norm (a
 * sum of squares added in another order) must agree to a relative 1e-10;
 * the residual must have fallen at least a hundredfold and the flags must
 * all be clear at the end.
 *
 * Classes: S 40^3 with 100 iterations, W 80^3 with 150, A 96^3 with 200.
 */
#include <math.h>

#include "kernel.h"

#define MAXT 1024   /* flags: at most this many threads */
#define MAXITERS 200
#define OMEGA 1.2
#define C0 0.1
#define MASK23 ((1ULL << 23) - 1)
#define MASK46 ((1ULL << 46) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 314159265ULL

/* Couplings to the neighbours below (m) and above (p) in i, j, k. */
static const double axm = 1.1, axp = 0.9, aym = 1.05, ayp = 0.95, azm = 1.2,
                    azp = 0.8;

static int nx, ny, nz, iters;
static long sx, sy; /* strides of j and k */
static int isync[MAXT];
static double rsum; /* the residual's reduction variable */

/* a * x mod 2^46, for a, x < 2^46. */
static inline unsigned long long mul46(unsigned long long a,
                                       unsigned long long x)
{
    unsigned long long a1 = a >> 23, a2 = a & MASK23;
    unsigned long long x1 = x >> 23, x2 = x & MASK23;
    unsigned long long mid = (a1 * x2 + a2 * x1) & MASK23;
    return ((mid << 23) + a2 * x2) & MASK46;
}

static inline long at(int i, int j, int k)
{
    return k * sy + j * sx + i;
}

/* Waits until the thread before has finished the plane, and takes its
 * flag. */
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

/* Tells the thread after that the plane is done, once it has taken the
 * last flag. */
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

/* The iterations, run by every thread of a team (or serially): u updated,
 * norm[it] the residual norm before iteration it, norm[iters] after the
 * last. */
static void ssor(double *u, const double *f, double *r, double *norm)
{
    const double d = axm + axp + aym + ayp + azm + azp + C0;
    int me = omp_get_thread_num(), nt = omp_get_num_threads();
    if (nt > MAXT)
        nt = MAXT; /* (not reached: checked in main) */
    for (int it = 0; it <= iters; it++) {
#pragma omp single
        rsum = 0;
#pragma omp for schedule(static) reduction(+ : rsum)
        for (int k = 1; k <= nz; k++)
            for (int j = 1; j <= ny; j++)
                for (int i = 1; i <= nx; i++) {
                    long p = at(i, j, k);
                    double au = d * u[p] - (axm * u[p - 1] + axp * u[p + 1] +
                                            aym * u[p - sx] + ayp * u[p + sx] +
                                            azm * u[p - sy] + azp * u[p + sy]);
                    r[p] = f[p] - au;
                    rsum += r[p] * r[p];
                }
#pragma omp single
        norm[it] = sqrt(rsum);
        if (it == iters)
            break;

        /* Lower sweep: (D - wL) r' = w r. */
        for (int k = 1; k <= nz; k++) {
            sync_left(me);
#pragma omp for schedule(static) nowait
            for (int j = 1; j <= ny; j++)
                for (int i = 1; i <= nx; i++) {
                    long p = at(i, j, k);
                    r[p] = OMEGA * (r[p] + axm * r[p - 1] + aym * r[p - sx] +
                                    azm * r[p - sy]) / d;
                }
            sync_right(me, nt);
        }
#pragma omp barrier

        /* Upper sweep: (D - wU) r' = (2 - w) D r. */
        for (int k = nz; k >= 1; k--) {
            sync_left(me);
#pragma omp for schedule(static) nowait
            for (int j = ny; j >= 1; j--)
                for (int i = nx; i >= 1; i--) {
                    long p = at(i, j, k);
                    r[p] = (2.0 - OMEGA) * r[p] +
                           OMEGA * (axp * r[p + 1] + ayp * r[p + sx] + azp * r[p + sy]) / d;
                }
            sync_right(me, nt);
        }
#pragma omp barrier

#pragma omp for schedule(static)
        for (int k = 1; k <= nz; k++)
            for (int j = 1; j <= ny; j++)
                for (int i = 1; i <= nx; i++) {
                    long p = at(i, j, k);
                    u[p] += r[p];
                }
    }
}

int main(int argc, char **argv)
{
    static const int n_of_class[] = {40, 80, 96};
    static const int iters_of_class[] = {100, 150, 200};
    int cls = kernel_class(argc, argv, "lu");
    nx = ny = nz = n_of_class[cls];
    iters = iters_of_class[cls];
    sx = nx + 2;
    sy = sx * (ny + 2);
    long points = sy * (nz + 2);
    int threads = kernel_team_size();
    if (threads > MAXT) {
        fprintf(stderr, "lu: at most %d threads\n", MAXT);
        return 2;
    }

    double *u = calloc(points, sizeof *u), *f = calloc(points, sizeof *f),
           *r = calloc(points, sizeof *r);
    unsigned long long x = SEED;
    const double scale = 1.0 / (double)(1ULL << 46);
    for (int k = 1; k <= nz; k++)
        for (int j = 1; j <= ny; j++)
            for (int i = 1; i <= nx; i++) {
                x = mul46(MULT, x);
                f[at(i, j, k)] = (double)x * scale;
            }

    double norm[MAXITERS + 1], snorm[MAXITERS + 1];
    double t0 = omp_get_wtime();
#pragma omp parallel
    ssor(u, f, r, norm);
    double seconds = omp_get_wtime() - t0;

    /* The same iterations serially, from u = 0. */
    double *su = calloc(points, sizeof *su), *sr = calloc(points, sizeof *sr);
    ssor(su, f, sr, snorm);
    long differ = 0;
    double sum = 0;
    for (long p = 0; p < points; p++) {
        differ += u[p] != su[p];
        sum += u[p];
    }
    double rel = 0;
    for (int it = 0; it <= iters; it++) {
        double e = fabs(norm[it] - snorm[it]) / snorm[it];
        if (!(e <= rel))
            rel = e; /* NaN too */
    }
    int flags = 0;
    for (int t = 0; t < MAXT; t++)
        flags += isync[t] != 0;
    int ok = differ == 0 && rel <= 1e-10 && flags == 0 &&
             norm[iters] < 1e-2 * norm[0];

    char details[256];
    snprintf(details, sizeof details,
             "n=%d iters=%d rnorm0=%.12e rnorm=%.12e sum=%.12e rel=%.1e differ=%ld", nx,
             iters, norm[0], norm[iters], sum, rel, differ);
    free(u);
    free(f);
    free(r);
    free(su);
    free(sr);
    return kernel_report("lu", cls, threads, seconds, ok, details);
}
