/* EP-like kernel (the "embarrassingly parallel" kernel of the NAS Parallel
 * Benchmarks): 2^M pairs of uniform numbers from the linear congruential
 * generator x' = 5^13 x mod 2^46 (seed 271828183), turned into Gaussian
 * pairs by the polar (Marsaglia) method; the sums of the Gaussian
 * deviates and the count of pairs in each square annulus
 * l <= max(|X|,|Y|) < l+1 are accumulated.
 *
 * The pairs are split into batches of 2^16; a batch finds its generator
 * state by a jump (multiplying the seed by the multiplier's 2^17-th power,
 * raised to the batch number), so batches are independent and are shared
 * out by a `for` loop with reduction(+: sx, sy); every thread counts the
 * annuli in its own array and adds it to the shared one with atomics.
 *
 * The generator is computed exactly in 64-bit integers (23-bit halves), so
 * the sequence is the one of the published method; with M = 24, 25 and 28
 * (classes S, W and A, as in NPB) the sums must match NPB's published
 * verification values to a relative 1e-8, and the number of accepted
 * pairs NPB's. */
#include <math.h>

#include "kernel.h"

#define MK 16         /* log2 of the pairs per batch */
#define NQ 10         /* annuli */
#define MASK23 ((1ULL << 23) - 1)
#define MASK46 ((1ULL << 46) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 271828183ULL

/* a * x mod 2^46, for a, x < 2^46. */
static inline unsigned long long mul46(unsigned long long a,
                                       unsigned long long x)
{
    unsigned long long a1 = a >> 23, a2 = a & MASK23;
    unsigned long long x1 = x >> 23, x2 = x & MASK23;
    unsigned long long mid = (a1 * x2 + a2 * x1) & MASK23;
    return ((mid << 23) + a2 * x2) & MASK46;
}

/* b^e mod 2^46. */
static unsigned long long pow46(unsigned long long b, unsigned long long e)
{
    unsigned long long r = 1;
    while (e) {
        if (e & 1)
            r = mul46(r, b);
        b = mul46(b, b);
        e >>= 1;
    }
    return r;
}

/* Runs batch `k`: adds its deviates to *sx, *sy and its counts to q. */
static void batch(long k, unsigned long long jump, double *sx, double *sy,
                  double q[NQ])
{
    const double scale = 1.0 / (double)(1ULL << 46);
    unsigned long long x = mul46(SEED, pow46(jump, (unsigned long long)k));
    double lx = 0, ly = 0;
    for (long i = 0; i < (1L << MK); i++) {
        x = mul46(MULT, x);
        double u = 2.0 * (double)x * scale - 1.0;
        x = mul46(MULT, x);
        double v = 2.0 * (double)x * scale - 1.0;
        double t = u * u + v * v;
        if (t <= 1.0) {
            double f = sqrt(-2.0 * log(t) / t);
            double gx = u * f, gy = v * f;
            int l = (int)fmax(fabs(gx), fabs(gy));
            q[l] += 1.0;
            lx += gx;
            ly += gy;
        }
    }
    *sx += lx;
    *sy += ly;
}

int main(int argc, char **argv)
{
    static const int m_of_class[] = {24, 25, 28};
    /* NPB EP's published sums for M = 24, 25, 28. */
    static const double sx_ref[] = {-3.247834652034740e+3,
                                    -2.863319731645753e+3,
                                    -4.295875165629892e+3};
    static const double sy_ref[] = {-6.958407078382297e+3,
                                    -6.320053679109499e+3,
                                    -1.580732573678431e+4};
    /* Accepted pairs (the annulus counts' total). */
    static const double gc_ref[] = {13176389, 26354769, 210832767};
    int cls = kernel_class(argc, argv, "ep");
    int m = m_of_class[cls];
    long batches = 1L << (m - MK);
    /* The multiplier to the power of the numbers one batch consumes. */
    unsigned long long jump = pow46(MULT, 2ULL << MK);
    int threads = kernel_team_size();

    double sx = 0, sy = 0, q[NQ] = {0};
    double t0 = omp_get_wtime();
#pragma omp parallel
    {
        double mine[NQ] = {0};
#pragma omp for reduction(+ : sx, sy) schedule(static)
        for (long k = 0; k < batches; k++)
            batch(k, jump, &sx, &sy, mine);
        for (int l = 0; l < NQ; l++) {
#pragma omp atomic
            q[l] += mine[l];
        }
    }
    double seconds = omp_get_wtime() - t0;

    /* Checks: NPB's published sums and number of accepted pairs (every
     * accepted pair counted once, in one annulus). */
    double gc = 0;
    for (int l = 0; l < NQ; l++)
        gc += q[l];
    int ok = fabs((sx - sx_ref[cls]) / sx_ref[cls]) <= 1e-8 &&
             fabs((sy - sy_ref[cls]) / sy_ref[cls]) <= 1e-8 &&
             gc == gc_ref[cls];

    char details[256];
    snprintf(details, sizeof details, "m=%d sx=%.15e sy=%.15e gc=%.0f", m,
             sx, sy, gc);
    return kernel_report("ep", cls, threads, seconds, ok, details);
}
