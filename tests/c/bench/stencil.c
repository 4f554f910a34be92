/* 2-D heat equation by Jacobi sweeps: on an (n+2) x (n+2) grid whose top
 * edge is held at 1 and whose other edges are held at 0, every sweep
 * replaces each interior point by the mean of its four neighbours (into a
 * second grid; the two grids swap roles) and computes the residual
 * max |new - old| with a `for` loop with reduction(max: ...). The sweeps
 * run in one parallel region (a `single` resets the residual and another
 * swaps the grids). Verified against the same sweeps run serially: the
 * grids and every sweep's residual must be identical (each point is
 * computed the same way whatever the thread, and max is exact), and the
 * residual must be falling. Only the parallel sweeps are timed. */
#include <math.h>

#include "kernel.h"

/* Grid with its boundary: interior all 0, top edge (row 0) 1. */
static double *new_grid(long n)
{
    long w = n + 2;
    double *g = calloc((size_t)(w * w), sizeof *g);
    for (long j = 0; j < w; j++)
        g[j] = 1.0;
    return g;
}

/* One sweep from `u` into `v`; returns the residual. */
static double sweep_serial(long n, const double *u, double *v)
{
    long w = n + 2;
    double res = 0;
    for (long i = 1; i <= n; i++)
        for (long j = 1; j <= n; j++) {
            double x = 0.25 * (u[(i - 1) * w + j] + u[(i + 1) * w + j] +
                               u[i * w + j - 1] + u[i * w + j + 1]);
            res = fmax(res, fabs(x - u[i * w + j]));
            v[i * w + j] = x;
        }
    return res;
}

int main(int argc, char **argv)
{
    static const long n_of_class[] = {512, 1024, 2048};
    static const int sweeps_of_class[] = {100, 300, 200};
    int cls = kernel_class(argc, argv, "stencil");
    long n = n_of_class[cls], w = n + 2;
    int sweeps = sweeps_of_class[cls];
    int threads = kernel_team_size();

    double *u = new_grid(n), *v = new_grid(n);
    double *res = malloc(sweeps * sizeof *res);
    double r = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel
    for (int s = 0; s < sweeps; s++) {
#pragma omp single
        r = 0;
        /* Read after the barrier that ended the previous swap. */
        const double *from = u;
        double *to = v;
#pragma omp for reduction(max : r) schedule(static)
        for (long i = 1; i <= n; i++)
            for (long j = 1; j <= n; j++) {
                double x = 0.25 * (from[(i - 1) * w + j] + from[(i + 1) * w + j] +
                                   from[i * w + j - 1] + from[i * w + j + 1]);
                r = fmax(r, fabs(x - from[i * w + j]));
                to[i * w + j] = x;
            }
#pragma omp single
        {
            res[s] = r;
            u = to;
            v = (double *)from;
        }
    }
    double seconds = omp_get_wtime() - t0;

    /* Serial reference. */
    double *su = new_grid(n), *sv = new_grid(n);
    int ok = 1;
    for (int s = 0; s < sweeps; s++) {
        double sr = sweep_serial(n, su, sv);
        ok = ok && sr == res[s];
        double *t = su;
        su = sv;
        sv = t;
    }
    double sum = 0;
    for (long k = 0; k < w * w; k++) {
        ok = ok && u[k] == su[k];
        sum += u[k];
    }
    ok = ok && res[sweeps - 1] < res[0] && res[sweeps - 1] > 0;

    char details[128];
    snprintf(details, sizeof details, "n=%ld sweeps=%d residual=%.12e sum=%.12e", n,
             sweeps, res[sweeps - 1], sum);
    free(u);
    free(v);
    free(su);
    free(sv);
    free(res);
    return kernel_report("stencil", cls, threads, seconds, ok, details);
}
