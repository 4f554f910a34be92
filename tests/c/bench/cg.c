/* CG-like kernel: a fixed number of conjugate gradient iterations on a
 * sparse symmetric positive definite matrix in CSR form, like the inner
 * solve of NPB's CG, with NPB CG's shapes: order n = 1400 / 7000 / 14000
 * (classes S / W / A) with about 57 / 73 / 133 entries per row (NPB's
 * 78148 / 508402 / 1853104 nonzeros), and NPB's 15 x 25 = 375 iterations.
 *
 * The matrix (order n) has, in every row i, the diagonal and the entries
 * (i, i +- d) mod n for K offsets d spread over [1, n/2) (so the columns
 * a row touches are scattered over the whole vector). The value of the
 * entry (i, j) depends only on the pair {i, j} (a hash), so the matrix is
 * symmetric; the diagonal is the sum of the row's off-diagonal magnitudes
 * plus SHIFT, so it is strictly diagonally dominant, hence positive
 * definite (and, SHIFT being small, not too well conditioned: the residual
 * falls by about 1e-2 .. 1e-6 over a class's iterations, far from rounding
 * noise).
 *
 * The solve (x0 = 0, b pseudo-random in (0.1, 1.1)) runs in one parallel
 * region: the matrix-vector product and the vector updates are `for`
 * loops, the dot products `for` loops with reduction(+: ...), as in NPB
 * CG. Vectors and the matrix are on the heap. Verified against the same
 * iterations run serially (the reductions add in another order): the
 * solutions must agree to a relative 1e-9 and the final residual norms to
 * 1e-9 of the initial one, and the residual must have dropped below
 * 1e-2 |b|. Only the parallel solve is timed. */
#include <math.h>

#include "kernel.h"

#define KMAX 66 /* offsets (class A): 2K+1 entries per row */
#define SHIFT 0.01 /* diagonal minus the off-diagonal magnitudes */

struct csr {
    long n;
    long *rowptr;
    int *col;
    double *val;
};

/* A value in (0.1, 1.1) for the unordered pair {i, j}. */
static double pair_value(long i, long j)
{
    unsigned long long a = (unsigned long long)(i < j ? i : j);
    unsigned long long b = (unsigned long long)(i < j ? j : i);
    unsigned long long h = a * 0x9E3779B97F4A7C15ULL ^ (b + 0x632BE59BD9B4E019ULL);
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ULL;
    h ^= h >> 32;
    return 0.1 + (double)(h >> 11) / (double)(1ULL << 53);
}

static struct csr build(long n, int K)
{
    long d[KMAX];
    /* Offsets: 1, then spread over [1, n/2) by a fixed stride. */
    d[0] = 1;
    for (int k = 1; k < K; k++)
        d[k] = (long)((double)(n / 2 - 1) * (0.61803398875 * k - floor(0.61803398875 * k))) + 1;
    struct csr a;
    a.n = n;
    a.rowptr = malloc((n + 1) * sizeof *a.rowptr);
    a.col = malloc((size_t)n * (2 * K + 1) * sizeof *a.col);
    a.val = malloc((size_t)n * (2 * K + 1) * sizeof *a.val);
    long e = 0;
    for (long i = 0; i < n; i++) {
        a.rowptr[i] = e;
        long diag = e++;
        double sum = 0;
        for (int k = 0; k < K; k++) {
            long js[2] = {(i + d[k]) % n, (i - d[k] + n) % n};
            for (int s = 0; s < 2; s++) {
                double v = -pair_value(i, js[s]);
                a.col[e] = (int)js[s];
                a.val[e++] = v;
                sum += fabs(v);
            }
        }
        a.col[diag] = (int)i;
        a.val[diag] = sum + SHIFT;
    }
    a.rowptr[n] = e;
    return a;
}

/* `iters` CG iterations for A x = b from x = 0, serially; returns the
 * final residual norm. */
static double cg_serial(const struct csr *a, const double *b, double *x,
                        int iters)
{
    long n = a->n;
    double *r = malloc(n * sizeof *r), *p = malloc(n * sizeof *p),
           *q = malloc(n * sizeof *q);
    double rho = 0;
    for (long i = 0; i < n; i++) {
        x[i] = 0;
        r[i] = p[i] = b[i];
        rho += r[i] * r[i];
    }
    for (int it = 0; it < iters; it++) {
        double pq = 0;
        for (long i = 0; i < n; i++) {
            double s = 0;
            for (long e = a->rowptr[i]; e < a->rowptr[i + 1]; e++)
                s += a->val[e] * p[a->col[e]];
            q[i] = s;
            pq += p[i] * s;
        }
        double alpha = rho / pq, rho_new = 0;
        for (long i = 0; i < n; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * q[i];
            rho_new += r[i] * r[i];
        }
        double beta = rho_new / rho;
        rho = rho_new;
        for (long i = 0; i < n; i++)
            p[i] = r[i] + beta * p[i];
    }
    free(r);
    free(p);
    free(q);
    return sqrt(rho);
}

/* The same iterations in parallel. */
static double cg_parallel(const struct csr *a, const double *b, double *x,
                          int iters)
{
    long n = a->n;
    const long *rowptr = a->rowptr;
    const int *col = a->col;
    const double *val = a->val;
    double *r = malloc(n * sizeof *r), *p = malloc(n * sizeof *p),
           *q = malloc(n * sizeof *q);
    double rho = 0, pq = 0, rho_new = 0;
#pragma omp parallel
    {
#pragma omp for reduction(+ : rho) schedule(static)
        for (long i = 0; i < n; i++) {
            x[i] = 0;
            r[i] = p[i] = b[i];
            rho += r[i] * r[i];
        }
        for (int it = 0; it < iters; it++) {
#pragma omp single
            {
                pq = 0;
                rho_new = 0;
            }
#pragma omp for reduction(+ : pq) schedule(static)
            for (long i = 0; i < n; i++) {
                double s = 0;
                for (long e = rowptr[i]; e < rowptr[i + 1]; e++)
                    s += val[e] * p[col[e]];
                q[i] = s;
                pq += p[i] * s;
            }
            double alpha = rho / pq;
#pragma omp for reduction(+ : rho_new) schedule(static)
            for (long i = 0; i < n; i++) {
                x[i] += alpha * p[i];
                r[i] -= alpha * q[i];
                rho_new += r[i] * r[i];
            }
            double beta = rho_new / rho;
#pragma omp for schedule(static)
            for (long i = 0; i < n; i++)
                p[i] = r[i] + beta * p[i];
            /* Everyone has read rho (the loop's barrier); now update it. */
#pragma omp single
            rho = rho_new;
        }
    }
    free(r);
    free(p);
    free(q);
    return sqrt(rho);
}

int main(int argc, char **argv)
{
    static const long n_of_class[] = {1400, 7000, 14000};
    static const int k_of_class[] = {28, 36, 66};
    static const int iters_of_class[] = {375, 375, 375};
    int cls = kernel_class(argc, argv, "cg");
    long n = n_of_class[cls];
    int iters = iters_of_class[cls];
    int threads = kernel_team_size();

    struct csr a = build(n, k_of_class[cls]);
    double *b = malloc(n * sizeof *b), *x = malloc(n * sizeof *x),
           *xs = malloc(n * sizeof *xs);
    for (long i = 0; i < n; i++)
        b[i] = pair_value(i, -1 - i);

    double t0 = omp_get_wtime();
    double rnorm = cg_parallel(&a, b, x, iters);
    double seconds = omp_get_wtime() - t0;

    double rnorm_serial = cg_serial(&a, b, xs, iters);
    double dx = 0, xx = 0, bb = 0;
    for (long i = 0; i < n; i++) {
        bb += b[i] * b[i];
        dx += (x[i] - xs[i]) * (x[i] - xs[i]);
        xx += xs[i] * xs[i];
    }
    double rel_x = sqrt(dx / xx);
    /* Relative to the initial residual: the final one is small, so the
     * rounding differences are large relative to it. */
    double rel_r = fabs(rnorm - rnorm_serial) / sqrt(bb);
    /* The initial residual is b. */
    int ok = rel_x <= 1e-9 && rel_r <= 1e-9 && rnorm < 1e-2 * sqrt(bb);

    char details[256];
    snprintf(details, sizeof details,
             "n=%ld nnz=%ld iters=%d rnorm=%.12e rel_x=%.1e rel_r=%.1e", n,
             a.rowptr[n], iters, rnorm, rel_x, rel_r);
    free(a.rowptr);
    free(a.col);
    free(a.val);
    free(b);
    free(x);
    free(xs);
    return kernel_report("cg", cls, threads, seconds, ok, details);
}
