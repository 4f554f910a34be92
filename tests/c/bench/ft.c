/* FT-like kernel (the 3-D FFT kernel of the NAS Parallel Benchmarks): the
 * spectral solution of a 3-D diffusion equation u_t = alpha lap(u) on a
 * periodic nx x ny x nz grid of complex numbers.
 *
 * The initial grid u0 is filled with pseudo-random numbers in [0, 1)
 * (real and imaginary parts, from the linear congruential generator
 * x' = 5^13 x mod 2^46). The timed part transforms it forward once, then
 * for t = 1 .. iters multiplies the spectrum by exp(-4 pi^2 alpha |k|^2)
 * (the evolution over one time step), transforms a copy back and takes a
 * checksum: the sum of 1024 scattered points, divided by the grid size.
 *
 * A 3-D FFT is three passes of 1-D radix-2 FFTs, one per dimension, each
 * a `for` loop over the lines of that dimension: the x lines are
 * contiguous and transformed in place; the y and z lines are strided
 * (nx and nx * ny apart), so blocks of FB neighbouring lines are gathered
 * into a per-thread buffer (malloc'd inside the parallel region),
 * transformed and scattered back, a transpose-like access. The whole
 * timed part is one parallel region; the passes, the evolution and the
 * checksum (reduction(+: ...)) are orphaned work-sharing loops in the
 * functions it calls.
 *
 * Verified twice: against the same functions run serially (called outside
 * any parallel region): every point is computed the same way whatever the
 * thread, only the checksums' sums are added in another order, so each
 * iteration's checksum must agree to a relative 1e-12; and the round trip
 * of the input through the forward and the inverse transform (in
 * parallel, untimed) must give it back to 1e-10.
 *
 * Classes: S 64^3 with 20 iterations, W 128^3 with 12, A 256 x 256 x 128
 * with 12.
 */
#include <math.h>

#include "kernel.h"

#define MAXITERS 20
#define FB 8 /* lines per gathered block */
#define NCHECK 1024
#define ALPHA 1e-6
#define MASK23 ((1ULL << 23) - 1)
#define MASK46 ((1ULL << 46) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 314159265ULL

typedef struct {
    double re, im;
} dcomplex;

/* a * x mod 2^46, for a, x < 2^46. */
static inline unsigned long long mul46(unsigned long long a,
                                       unsigned long long x)
{
    unsigned long long a1 = a >> 23, a2 = a & MASK23;
    unsigned long long x1 = x >> 23, x2 = x & MASK23;
    unsigned long long mid = (a1 * x2 + a2 * x1) & MASK23;
    return ((mid << 23) + a2 * x2) & MASK46;
}

static int nx, ny, nz, maxn, iters;
static long ntotal;
static dcomplex *roots[3]; /* exp(-2 pi i k / n) for the three lengths */
static double chk_re, chk_im; /* the checksum's reduction variables */

static dcomplex *make_roots(int n)
{
    dcomplex *w = malloc((n / 2) * sizeof *w);
    for (int k = 0; k < n / 2; k++) {
        double a = -2.0 * M_PI * (double)k / (double)n;
        w[k].re = cos(a);
        w[k].im = sin(a);
    }
    return w;
}

/* In-place radix-2 FFT of x[0 .. n) (n a power of 2); inverse: the
 * conjugate roots, no scaling. */
static void fft1(dcomplex *x, int n, const dcomplex *w, int inverse)
{
    for (int i = 0, j = 0; i < n; i++) {
        if (i < j) {
            dcomplex t = x[i];
            x[i] = x[j];
            x[j] = t;
        }
        int bit = n >> 1;
        for (; j & bit; bit >>= 1)
            j ^= bit;
        j ^= bit;
    }
    double sign = inverse ? -1.0 : 1.0;
    for (int len = 2; len <= n; len <<= 1) {
        int half = len / 2, step = n / len;
        for (int s = 0; s < n; s += len)
            for (int k = 0; k < half; k++) {
                double wr = w[k * step].re, wi = sign * w[k * step].im;
                dcomplex a = x[s + k], b = x[s + k + half];
                double br = b.re * wr - b.im * wi, bi = b.re * wi + b.im * wr;
                x[s + k].re = a.re + br;
                x[s + k].im = a.im + bi;
                x[s + k + half].re = a.re - br;
                x[s + k + half].im = a.im - bi;
            }
    }
}

static inline long at(int i, int j, int k)
{
    return ((long)k * ny + j) * nx + i;
}

/* The 3-D FFT of u in place; buf: FB * maxn numbers of this thread. */
static void fft3(dcomplex *u, int inverse, dcomplex *buf)
{
    /* x: contiguous lines. */
#pragma omp for schedule(static)
    for (long line = 0; line < (long)ny * nz; line++)
        fft1(u + line * nx, nx, roots[0], inverse);

    /* y: lines nx apart; blocks of FB neighbouring ones per plane k. */
    int blocks = nx / FB;
#pragma omp for schedule(static)
    for (long kb = 0; kb < (long)nz * blocks; kb++) {
        int k = (int)(kb / blocks), i0 = (int)(kb % blocks) * FB;
        for (int j = 0; j < ny; j++)
            for (int b = 0; b < FB; b++)
                buf[b * ny + j] = u[at(i0 + b, j, k)];
        for (int b = 0; b < FB; b++)
            fft1(buf + b * ny, ny, roots[1], inverse);
        for (int j = 0; j < ny; j++)
            for (int b = 0; b < FB; b++)
                u[at(i0 + b, j, k)] = buf[b * ny + j];
    }

    /* z: lines nx * ny apart; blocks per row j. */
#pragma omp for schedule(static)
    for (long jb = 0; jb < (long)ny * blocks; jb++) {
        int j = (int)(jb / blocks), i0 = (int)(jb % blocks) * FB;
        for (int k = 0; k < nz; k++)
            for (int b = 0; b < FB; b++)
                buf[b * nz + k] = u[at(i0 + b, j, k)];
        for (int b = 0; b < FB; b++)
            fft1(buf + b * nz, nz, roots[2], inverse);
        for (int k = 0; k < nz; k++)
            for (int b = 0; b < FB; b++)
                u[at(i0 + b, j, k)] = buf[b * nz + k];
    }
}

/* exp(-4 pi^2 alpha |k|^2) for every wave number (k = i, or i - n above
 * n / 2). */
static void make_factors(double *f)
{
#pragma omp for schedule(static)
    for (int k = 0; k < nz; k++)
        for (int j = 0; j < ny; j++)
            for (int i = 0; i < nx; i++) {
                int ki = i < nx / 2 ? i : i - nx, kj = j < ny / 2 ? j : j - ny,
                    kk = k < nz / 2 ? k : k - nz;
                double k2 = (double)ki * ki + (double)kj * kj + (double)kk * kk;
                f[at(i, j, k)] = exp(-4.0 * M_PI * M_PI * ALPHA * k2);
            }
}

/* The timed steps (called by every thread of a team, or serially):
 * u1 = FFT(u0), then `iters` times u1 *= f, u2 = inverse FFT(u1) and
 * chk[t] = its checksum. */
static void ft_steps(const dcomplex *u0, dcomplex *u1, dcomplex *u2, double *f,
                     dcomplex *chk, dcomplex *buf)
{
    make_factors(f);
#pragma omp for schedule(static)
    for (long p = 0; p < ntotal; p++)
        u1[p] = u0[p];
    fft3(u1, 0, buf);
    for (int t = 1; t <= iters; t++) {
#pragma omp for schedule(static)
        for (long p = 0; p < ntotal; p++) {
            u1[p].re *= f[p];
            u1[p].im *= f[p];
            u2[p] = u1[p];
        }
        fft3(u2, 1, buf);
#pragma omp single
        {
            chk_re = 0;
            chk_im = 0;
        }
#pragma omp for schedule(static) reduction(+ : chk_re, chk_im)
        for (int q = 1; q <= NCHECK; q++) {
            long p = at(q % nx, (3 * q) % ny, (5 * q) % nz);
            chk_re += u2[p].re;
            chk_im += u2[p].im;
        }
#pragma omp single
        {
            chk[t].re = chk_re / (double)ntotal;
            chk[t].im = chk_im / (double)ntotal;
        }
    }
}

int main(int argc, char **argv)
{
    static const int nx_of_class[] = {64, 128, 256};
    static const int ny_of_class[] = {64, 128, 256};
    static const int nz_of_class[] = {64, 128, 128};
    static const int iters_of_class[] = {20, 12, 12};
    int cls = kernel_class(argc, argv, "ft");
    nx = nx_of_class[cls];
    ny = ny_of_class[cls];
    nz = nz_of_class[cls];
    iters = iters_of_class[cls];
    maxn = nx > ny ? nx : ny;
    maxn = maxn > nz ? maxn : nz;
    ntotal = (long)nx * ny * nz;
    int threads = kernel_team_size();

    roots[0] = make_roots(nx);
    roots[1] = make_roots(ny);
    roots[2] = make_roots(nz);
    dcomplex *u0 = malloc(ntotal * sizeof *u0), *u1 = malloc(ntotal * sizeof *u1),
             *u2 = malloc(ntotal * sizeof *u2);
    double *f = malloc(ntotal * sizeof *f);
    const double scale = 1.0 / (double)(1ULL << 46);
    unsigned long long x = SEED;
    for (long p = 0; p < ntotal; p++) {
        x = mul46(MULT, x);
        u0[p].re = (double)x * scale;
        x = mul46(MULT, x);
        u0[p].im = (double)x * scale;
    }

    dcomplex chk[MAXITERS + 1], schk[MAXITERS + 1];
    double t0 = omp_get_wtime();
#pragma omp parallel
    {
        dcomplex *buf = malloc((size_t)FB * maxn * sizeof *buf);
        ft_steps(u0, u1, u2, f, chk, buf);
        free(buf);
    }
    double seconds = omp_get_wtime() - t0;

    /* Round trip, in parallel: u2 = inverse FFT(FFT(u0)) / N. */
    double err = 0;
    long bad = 0;
#pragma omp parallel
    {
        dcomplex *buf = malloc((size_t)FB * maxn * sizeof *buf);
#pragma omp for schedule(static)
        for (long p = 0; p < ntotal; p++)
            u2[p] = u0[p];
        fft3(u2, 0, buf);
        fft3(u2, 1, buf);
#pragma omp for schedule(static) reduction(max : err) reduction(+ : bad)
        for (long p = 0; p < ntotal; p++) {
            double e = fmax(fabs(u2[p].re / (double)ntotal - u0[p].re),
                            fabs(u2[p].im / (double)ntotal - u0[p].im));
            err = fmax(err, e);
            bad += !(e <= 1e-10); /* NaN too */
        }
        free(buf);
    }

    /* The same steps serially. */
    dcomplex *buf = malloc((size_t)FB * maxn * sizeof *buf);
    ft_steps(u0, u1, u2, f, schk, buf);
    free(buf);
    double rel = 0;
    for (int t = 1; t <= iters; t++) {
        double d = hypot(chk[t].re - schk[t].re, chk[t].im - schk[t].im);
        rel = fmax(rel, d / hypot(schk[t].re, schk[t].im));
    }
    int ok = rel <= 1e-12 && bad == 0;

    char details[256];
    snprintf(details, sizeof details,
             "n=%dx%dx%d iters=%d chk=%.15e,%.15e rel=%.1e roundtrip=%.1e", nx, ny, nz,
             iters, chk[iters].re, chk[iters].im, rel, err);
    free(u0);
    free(u1);
    free(u2);
    free(f);
    for (int d = 0; d < 3; d++)
        free(roots[d]);
    return kernel_report("ft", cls, threads, seconds, ok, details);
}
