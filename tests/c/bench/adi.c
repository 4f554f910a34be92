/* ADI-like kernel (the structure of the NAS Parallel Benchmarks' SP and
 * BT): time steps of an alternating-direction implicit solver for the
 * anisotropic heat equation u_t = lap(u) + f on an n^3 grid (zero
 * boundary, f pseudo-random in [0, 1)), in the approximately factored form
 * (I - lx dxx)(I - ly dyy)(I - lz dzz) du = dt (lap(u) + f).
 *
 * A time step is five `for` loops, each ending in its barrier: the
 * right-hand side (7-point stencil, over k); the x solve, a tridiagonal
 * (Thomas) solve along every contiguous x line (over k, then j); the y
 * solve along the lines nx + 2 apart (over k, then i); the z solve along
 * the lines a plane apart (over j, then i); and u += du (over k). Every
 * NORM_EVERY steps a sixth, with reduction(+: ...), takes the squared
 * norm of the update. All the steps run in one parallel region, the loops
 * orphaned in the functions it calls, so a thread passes about five
 * barriers per step: tens of thousands in class W.
 *
 * Verified against the same steps run serially (the same function called
 * outside any parallel region): every point is computed by the same
 * expression in the same order whatever the thread, so u must be identical
 * bit for bit and every norm (a sum of squares added in another order)
 * must agree to a relative 1e-10; and the update must be shrinking (the
 * solution settles towards its steady state).
 *
 * Classes: S 16^3 with 1000 steps, W 24^3 with 6000 steps, A 32^3 with
 * 10000 steps. */
#include <math.h>

#include "kernel.h"

#define MAXN 64
#define NORM_EVERY 50
#define MAXNORMS (10000 / NORM_EVERY + 1)
#define DT 0.00625
#define MASK23 ((1ULL << 23) - 1)
#define MASK46 ((1ULL << 46) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 314159265ULL

/* dt times the diffusion coefficients over h^2, per direction. */
static const double lx = 1.0 * DT * 16.0, ly = 0.7 * DT * 16.0, lz = 0.4 * DT * 16.0;

static int n, steps;
static long sx, sy; /* strides of j and k */
static double dsum; /* the norm's reduction variable */

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

/* Solves (I - l d2) y = x in place on the line x[s], x[2s] .. x[n s]
 * (zero beyond both ends) by the Thomas algorithm; cp: n + 1 scratch. */
static void thomas(double *x, long s, double l, double *cp)
{
    const double a = -l, b = 1.0 + 2.0 * l, c = -l;
    cp[1] = c / b;
    x[s] = x[s] / b;
    for (int i = 2; i <= n; i++) {
        double m = b - a * cp[i - 1];
        cp[i] = c / m;
        x[i * s] = (x[i * s] - a * x[(i - 1) * s]) / m;
    }
    for (int i = n - 1; i >= 1; i--)
        x[i * s] -= cp[i] * x[(i + 1) * s];
}

static void compute_rhs(const double *u, const double *f, double *du)
{
#pragma omp for schedule(static)
    for (int k = 1; k <= n; k++)
        for (int j = 1; j <= n; j++)
            for (int i = 1; i <= n; i++) {
                long p = at(i, j, k);
                du[p] = lx * (u[p - 1] - 2.0 * u[p] + u[p + 1]) +
                        ly * (u[p - sx] - 2.0 * u[p] + u[p + sx]) +
                        lz * (u[p - sy] - 2.0 * u[p] + u[p + sy]) + DT * f[p];
            }
}

static void x_solve(double *du)
{
    double cp[MAXN + 1];
#pragma omp for schedule(static)
    for (int k = 1; k <= n; k++)
        for (int j = 1; j <= n; j++)
            thomas(du + at(0, j, k), 1, lx, cp);
}

static void y_solve(double *du)
{
    double cp[MAXN + 1];
#pragma omp for schedule(static)
    for (int k = 1; k <= n; k++)
        for (int i = 1; i <= n; i++)
            thomas(du + at(i, 0, k), sx, ly, cp);
}

static void z_solve(double *du)
{
    double cp[MAXN + 1];
#pragma omp for schedule(static)
    for (int j = 1; j <= n; j++)
        for (int i = 1; i <= n; i++)
            thomas(du + at(i, j, 0), sy, lz, cp);
}

static void add(double *u, const double *du)
{
#pragma omp for schedule(static)
    for (int k = 1; k <= n; k++)
        for (int j = 1; j <= n; j++)
            for (int i = 1; i <= n; i++) {
                long p = at(i, j, k);
                u[p] += du[p];
            }
}

/* The time steps, run by every thread of a team (or serially); norms[m]:
 * the norm of the update of step m * NORM_EVERY. */
static void adi(double *u, const double *f, double *du, double *norms)
{
    for (int step = 0; step < steps; step++) {
        compute_rhs(u, f, du);
        x_solve(du);
        y_solve(du);
        z_solve(du);
        add(u, du);
        if (step % NORM_EVERY == 0) {
#pragma omp single
            dsum = 0;
#pragma omp for schedule(static) reduction(+ : dsum)
            for (int k = 1; k <= n; k++)
                for (int j = 1; j <= n; j++)
                    for (int i = 1; i <= n; i++) {
                        double d = du[at(i, j, k)];
                        dsum += d * d;
                    }
#pragma omp single
            norms[step / NORM_EVERY] = sqrt(dsum);
        }
    }
}

int main(int argc, char **argv)
{
    static const int n_of_class[] = {16, 24, 32};
    static const int steps_of_class[] = {1000, 6000, 10000};
    int cls = kernel_class(argc, argv, "adi");
    n = n_of_class[cls];
    steps = steps_of_class[cls];
    sx = n + 2;
    sy = sx * (n + 2);
    long points = sy * (n + 2);
    int nnorms = (steps - 1) / NORM_EVERY + 1;
    int threads = kernel_team_size();

    double *u = calloc(points, sizeof *u), *f = calloc(points, sizeof *f),
           *du = calloc(points, sizeof *du);
    unsigned long long x = SEED;
    const double scale = 1.0 / (double)(1ULL << 46);
    for (int k = 1; k <= n; k++)
        for (int j = 1; j <= n; j++)
            for (int i = 1; i <= n; i++) {
                x = mul46(MULT, x);
                f[at(i, j, k)] = (double)x * scale;
            }

    double norms[MAXNORMS], snorms[MAXNORMS];
    double t0 = omp_get_wtime();
#pragma omp parallel
    adi(u, f, du, norms);
    double seconds = omp_get_wtime() - t0;

    /* The same steps serially, from u = 0. */
    double *su = calloc(points, sizeof *su), *sdu = calloc(points, sizeof *sdu);
    adi(su, f, sdu, snorms);
    long differ = 0;
    double sum = 0;
    for (long p = 0; p < points; p++) {
        differ += u[p] != su[p];
        sum += u[p];
    }
    double rel = 0;
    for (int m = 0; m < nnorms; m++) {
        double e = fabs(norms[m] - snorms[m]) / snorms[m];
        if (!(e <= rel))
            rel = e; /* NaN too */
    }
    int ok = differ == 0 && rel <= 1e-10 && norms[nnorms - 1] < 0.5 * norms[0];

    char details[256];
    snprintf(details, sizeof details,
             "n=%d steps=%d barriers=%d dnorm0=%.12e dnorm=%.12e sum=%.12e rel=%.1e "
             "differ=%ld",
             n, steps, 5 * steps + 3 * nnorms, norms[0], norms[nnorms - 1], sum, rel,
             differ);
    free(u);
    free(f);
    free(du);
    free(su);
    free(sdu);
    return kernel_report("adi", cls, threads, seconds, ok, details);
}
