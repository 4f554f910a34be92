/* MG-like kernel (the multigrid kernel of the NAS Parallel Benchmarks):
 * V-cycles of a multigrid solver for the discrete Poisson problem
 * A u = v on an n^3 periodic grid, v zero but for +1 at ten points and -1
 * at ten others (placed by the linear congruential generator
 * x' = 5^13 x mod 2^46).
 *
 * Every level k = 1 .. lt (n = 2^lt) has its own grids u[k] and r[k] of
 * (2^k + 2)^3 points (one ghost layer each side, filled from the opposite
 * face: periodic), built in main with malloc as `double ***`: an array of
 * plane pointers into an array of row pointers into the data. The
 * operators are 27-point stencils with NPB MG's coefficients (A: -8/3, 0,
 * 1/6, 1/12 for the centre, faces, edges, corners; the smoother S: -3/8,
 * 1/32, -1/64, 0): residual r = v - A u, smoothing u += S r, restriction
 * (full weighting, 1/2 1/4 1/8 1/16) to the next coarser level, and
 * trilinear prolongation added into the next finer one. A V-cycle
 * restricts the residual down to the coarsest level, smooths there, then
 * on the way up prolongs the correction, recomputes the residual and
 * smooths. Every operator is a `parallel for` over the outer dimension
 * (so a V-cycle opens tens of parallel regions, like the OpenMP MG codes),
 * followed by the periodic ghost copy, two more `parallel for` loops.
 *
 * Verified against a serial run of the same code (omp_set_num_threads(1),
 * the same grids reset): every point is computed by the same expression
 * in the same order whatever the team, so the finest u and r must be
 * identical, bit for bit; the residual norms (sums of up to 2^24 squares
 * by reduction(+: ...), added in another order) must agree to a relative
 * 1e-10; and the cycles must have reduced the residual norm at least
 * tenfold. Only the parallel cycles (and the residuals before and after)
 * are timed.
 *
 * Classes: S 64^3 with 16 cycles, W 128^3 with 16 cycles, A 256^3 with 10
 * cycles. */
#include <math.h>

#include "kernel.h"

#define MAXLEVEL 10
#define MASK23 ((1ULL << 23) - 1)
#define MASK46 ((1ULL << 46) - 1)
#define MULT 1220703125ULL /* 5^13 */
#define SEED 314159265ULL

typedef double ***grid;

/* a * x mod 2^46, for a, x < 2^46. */
static inline unsigned long long mul46(unsigned long long a,
                                       unsigned long long x)
{
    unsigned long long a1 = a >> 23, a2 = a & MASK23;
    unsigned long long x1 = x >> 23, x2 = x & MASK23;
    unsigned long long mid = (a1 * x2 + a2 * x1) & MASK23;
    return ((mid << 23) + a2 * x2) & MASK46;
}

/* A zeroed grid of (n+2)^3 points: g[i3][i2][i1], 0 <= i < n+2. */
static grid alloc_grid(int n)
{
    long m = n + 2;
    grid g = malloc(m * sizeof *g);
    double **rows = malloc(m * m * sizeof *rows);
    double *data = calloc((size_t)(m * m * m), sizeof *data);
    for (long i3 = 0; i3 < m; i3++) {
        g[i3] = rows + i3 * m;
        for (long i2 = 0; i2 < m; i2++)
            g[i3][i2] = data + (i3 * m + i2) * m;
    }
    return g;
}

static void free_grid(grid g)
{
    free(g[0][0]);
    free(g[0]);
    free(g);
}

/* The 27-point stencil c at (i3, i2, i1): the centre, the 6 faces, the 12
 * edges and the 8 corners, each group added in a fixed order. */
static inline double stencil(grid z, int i3, int i2, int i1, const double c[4])
{
    double *const *p = z[i3], *const *lo = z[i3 - 1], *const *hi = z[i3 + 1];
    double faces = p[i2][i1 - 1] + p[i2][i1 + 1] + p[i2 - 1][i1] +
                   p[i2 + 1][i1] + lo[i2][i1] + hi[i2][i1];
    double edges = p[i2 - 1][i1 - 1] + p[i2 - 1][i1 + 1] + p[i2 + 1][i1 - 1] +
                   p[i2 + 1][i1 + 1] + lo[i2][i1 - 1] + lo[i2][i1 + 1] +
                   lo[i2 - 1][i1] + lo[i2 + 1][i1] + hi[i2][i1 - 1] +
                   hi[i2][i1 + 1] + hi[i2 - 1][i1] + hi[i2 + 1][i1];
    double corners = lo[i2 - 1][i1 - 1] + lo[i2 - 1][i1 + 1] +
                     lo[i2 + 1][i1 - 1] + lo[i2 + 1][i1 + 1] +
                     hi[i2 - 1][i1 - 1] + hi[i2 - 1][i1 + 1] +
                     hi[i2 + 1][i1 - 1] + hi[i2 + 1][i1 + 1];
    return c[0] * p[i2][i1] + c[1] * faces + c[2] * edges + c[3] * corners;
}

static const double a_coef[4] = {-8.0 / 3.0, 0.0, 1.0 / 6.0, 1.0 / 12.0};
static const double s_coef[4] = {-3.0 / 8.0, 1.0 / 32.0, -1.0 / 64.0, 0.0};

/* Fills the ghost layers of z (interior n^3) from the opposite faces. */
static void comm3(grid z, int n)
{
#pragma omp parallel for schedule(static)
    for (int i3 = 1; i3 <= n; i3++) {
        for (int i2 = 1; i2 <= n; i2++) {
            z[i3][i2][0] = z[i3][i2][n];
            z[i3][i2][n + 1] = z[i3][i2][1];
        }
        for (int i1 = 0; i1 <= n + 1; i1++) {
            z[i3][0][i1] = z[i3][n][i1];
            z[i3][n + 1][i1] = z[i3][1][i1];
        }
    }
#pragma omp parallel for schedule(static)
    for (int i2 = 0; i2 <= n + 1; i2++)
        for (int i1 = 0; i1 <= n + 1; i1++) {
            z[0][i2][i1] = z[n][i2][i1];
            z[n + 1][i2][i1] = z[1][i2][i1];
        }
}

static void zero3(grid z, int n)
{
#pragma omp parallel for schedule(static)
    for (int i3 = 0; i3 <= n + 1; i3++)
        for (int i2 = 0; i2 <= n + 1; i2++)
            for (int i1 = 0; i1 <= n + 1; i1++)
                z[i3][i2][i1] = 0.0;
}

/* r = v - A u (r may be v). */
static void resid(grid u, grid v, grid r, int n)
{
#pragma omp parallel for schedule(static)
    for (int i3 = 1; i3 <= n; i3++)
        for (int i2 = 1; i2 <= n; i2++)
            for (int i1 = 1; i1 <= n; i1++)
                r[i3][i2][i1] = v[i3][i2][i1] - stencil(u, i3, i2, i1, a_coef);
    comm3(r, n);
}

/* u += S r. */
static void psinv(grid r, grid u, int n)
{
#pragma omp parallel for schedule(static)
    for (int i3 = 1; i3 <= n; i3++)
        for (int i2 = 1; i2 <= n; i2++)
            for (int i1 = 1; i1 <= n; i1++)
                u[i3][i2][i1] += stencil(r, i3, i2, i1, s_coef);
    comm3(u, n);
}

/* Full weighting of the fine rf (interior 2m) to the coarse rc (m):
 * coarse point j sits on fine point 2j - 1. */
static void rprj3(grid rf, grid rc, int m)
{
    static const double w[4] = {0.5, 0.25, 0.125, 0.0625};
#pragma omp parallel for schedule(static)
    for (int j3 = 1; j3 <= m; j3++)
        for (int j2 = 1; j2 <= m; j2++)
            for (int j1 = 1; j1 <= m; j1++)
                rc[j3][j2][j1] = stencil(rf, 2 * j3 - 1, 2 * j2 - 1, 2 * j1 - 1, w);
    comm3(rc, m);
}

/* Adds the trilinear interpolation of the coarse uc (interior m, ghosts
 * filled) to the fine uf (2m): fine point 2j - 1 + a (a = 0, 1) is the mean
 * of coarse points j .. j + a along each axis. */
static void interp(grid uc, grid uf, int m)
{
#pragma omp parallel for schedule(static)
    for (int j3 = 1; j3 <= m; j3++)
        for (int j2 = 1; j2 <= m; j2++)
            for (int j1 = 1; j1 <= m; j1++)
                for (int a3 = 0; a3 < 2; a3++)
                    for (int a2 = 0; a2 < 2; a2++)
                        for (int a1 = 0; a1 < 2; a1++) {
                            double s = 0;
                            for (int b3 = 0; b3 <= a3; b3++)
                                for (int b2 = 0; b2 <= a2; b2++)
                                    for (int b1 = 0; b1 <= a1; b1++)
                                        s += uc[j3 + b3][j2 + b2][j1 + b1];
                            uf[2 * j3 - 1 + a3][2 * j2 - 1 + a2][2 * j1 - 1 + a1] +=
                                s / (double)(1 << (a1 + a2 + a3));
                        }
    comm3(uf, 2 * m);
}

/* One V-cycle on the levels 1 .. lt: u[lt] improved, r[lt] its residual
 * for v. */
static void vcycle(grid *u, grid *r, grid v, int lt)
{
    for (int k = lt; k > 1; k--)
        rprj3(r[k], r[k - 1], 1 << (k - 1));
    zero3(u[1], 2);
    psinv(r[1], u[1], 2);
    for (int k = 2; k < lt; k++) {
        int n = 1 << k;
        zero3(u[k], n);
        interp(u[k - 1], u[k], n / 2);
        resid(u[k], r[k], r[k], n);
        psinv(r[k], u[k], n);
    }
    int n = 1 << lt;
    interp(u[lt - 1], u[lt], n / 2);
    resid(u[lt], v, r[lt], n);
    psinv(r[lt], u[lt], n);
}

/* The L2 norm of the interior of r, divided by sqrt(n^3). */
static double norm2(grid r, int n)
{
    double s = 0;
#pragma omp parallel for schedule(static) reduction(+ : s)
    for (int i3 = 1; i3 <= n; i3++)
        for (int i2 = 1; i2 <= n; i2++)
            for (int i1 = 1; i1 <= n; i1++)
                s += r[i3][i2][i1] * r[i3][i2][i1];
    return sqrt(s / ((double)n * n * n));
}

/* Runs `cycles` V-cycles from u = 0; returns the final residual norm and
 * the initial one in *first. */
static double solve(grid *u, grid *r, grid v, int lt, int cycles, double *first)
{
    int n = 1 << lt;
    zero3(u[lt], n);
    resid(u[lt], v, r[lt], n);
    *first = norm2(r[lt], n);
    for (int it = 0; it < cycles; it++) {
        vcycle(u, r, v, lt);
        resid(u[lt], v, r[lt], n);
    }
    return norm2(r[lt], n);
}

int main(int argc, char **argv)
{
    static const int lt_of_class[] = {6, 7, 8};
    static const int cycles_of_class[] = {16, 16, 10};
    int cls = kernel_class(argc, argv, "mg");
    int lt = lt_of_class[cls], n = 1 << lt, cycles = cycles_of_class[cls];
    int threads = kernel_team_size();

    grid u[MAXLEVEL + 1], r[MAXLEVEL + 1];
    for (int k = 1; k <= lt; k++) {
        u[k] = alloc_grid(1 << k);
        r[k] = alloc_grid(1 << k);
    }
    grid v = alloc_grid(n);
    unsigned long long x = SEED;
    for (int c = 0; c < 20; c++) {
        int i[3];
        for (int d = 0; d < 3; d++) {
            x = mul46(MULT, x);
            i[d] = 1 + (int)(x % (unsigned long long)n);
        }
        v[i[0]][i[1]][i[2]] += c < 10 ? 1.0 : -1.0;
    }
    comm3(v, n);

    double first, t0 = omp_get_wtime();
    double rnm = solve(u, r, v, lt, cycles, &first);
    double seconds = omp_get_wtime() - t0;

    /* Keep the parallel result, then rerun serially on the same grids. */
    size_t points = (size_t)(n + 2) * (n + 2) * (n + 2);
    double *pu = malloc(points * sizeof *pu), *pr = malloc(points * sizeof *pr);
    memcpy(pu, u[lt][0][0], points * sizeof *pu);
    memcpy(pr, r[lt][0][0], points * sizeof *pr);
    omp_set_num_threads(1);
    double sfirst, srnm = solve(u, r, v, lt, cycles, &sfirst);
    omp_set_num_threads(threads);
    long differ = 0;
    for (size_t p = 0; p < points; p++)
        differ += pu[p] != u[lt][0][0][p] || pr[p] != r[lt][0][0][p];
    double rel = fabs(rnm - srnm) / srnm;
    int ok = differ == 0 && rel <= 1e-10 && fabs(first - sfirst) <= 1e-10 * sfirst &&
             rnm < 0.1 * first;

    char details[256];
    snprintf(details, sizeof details,
             "n=%d levels=%d cycles=%d rnm_first=%.12e rnm=%.15e rel=%.1e differ=%ld", n,
             lt, cycles, first, rnm, rel, differ);
    for (int k = 1; k <= lt; k++) {
        free_grid(u[k]);
        free_grid(r[k]);
    }
    free_grid(v);
    free(pu);
    free(pr);
    return kernel_report("mg", cls, threads, seconds, ok, details);
}
