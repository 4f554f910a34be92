/* A verified kernel: conjugate gradient on the 5-point Laplacian of a
 * G x G grid (CSR sparse matrix), the whole solve in one parallel region
 * (orphan-free work-sharing loops, reductions and singles in the
 * iteration), checked against the known solution and against the same
 * algorithm run serially; then a dense matrix multiply of small integers
 * (exact in doubles) checked against a serial product. */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "check.h"

#define G 128
#define N (G * G)
#define MAXIT 1000
#define TOL 1e-10
#define M 96

struct csr {
    int *rowptr;
    int *col;
    double *val;
};

static struct csr build_laplacian(void)
{
    struct csr a;
    a.rowptr = malloc((N + 1) * sizeof *a.rowptr);
    a.col = malloc(5 * N * sizeof *a.col);
    a.val = malloc(5 * N * sizeof *a.val);
    int k = 0;
    for (int i = 0; i < G; i++)
        for (int j = 0; j < G; j++) {
            int row = i * G + j;
            a.rowptr[row] = k;
            if (i > 0) {
                a.col[k] = row - G;
                a.val[k++] = -1;
            }
            if (j > 0) {
                a.col[k] = row - 1;
                a.val[k++] = -1;
            }
            a.col[k] = row;
            a.val[k++] = 4;
            if (j < G - 1) {
                a.col[k] = row + 1;
                a.val[k++] = -1;
            }
            if (i < G - 1) {
                a.col[k] = row + G;
                a.val[k++] = -1;
            }
        }
    a.rowptr[N] = k;
    return a;
}

static double row_times(const struct csr *a, const double *v, int row)
{
    double s = 0;
    for (int k = a->rowptr[row]; k < a->rowptr[row + 1]; k++)
        s += a->val[k] * v[a->col[k]];
    return s;
}

/* Serial CG; returns the number of iterations. */
static int cg_serial(const struct csr *a, const double *b, double *x)
{
    double *r = malloc(N * sizeof *r), *p = malloc(N * sizeof *p),
           *q = malloc(N * sizeof *q);
    double rr = 0, bb = 0;
    for (int i = 0; i < N; i++) {
        x[i] = 0;
        r[i] = p[i] = b[i];
        rr += r[i] * r[i];
    }
    bb = rr;
    int it;
    for (it = 0; it < MAXIT && sqrt(rr) > TOL * sqrt(bb); it++) {
        double pq = 0;
        for (int i = 0; i < N; i++) {
            q[i] = row_times(a, p, i);
            pq += p[i] * q[i];
        }
        double alpha = rr / pq, rr_new = 0;
        for (int i = 0; i < N; i++) {
            x[i] += alpha * p[i];
            r[i] -= alpha * q[i];
            rr_new += r[i] * r[i];
        }
        double beta = rr_new / rr;
        for (int i = 0; i < N; i++)
            p[i] = r[i] + beta * p[i];
        rr = rr_new;
    }
    free(r);
    free(p);
    free(q);
    return it;
}

/* The same algorithm in one parallel region. */
static int cg_parallel(const struct csr *a, const double *b, double *x)
{
    double *r = malloc(N * sizeof *r), *p = malloc(N * sizeof *p),
           *q = malloc(N * sizeof *q);
    double rr = 0, pq = 0, rr_new = 0;
    int iterations = 0;
#pragma omp parallel
    {
#pragma omp for reduction(+ : rr) schedule(static)
        for (int i = 0; i < N; i++) {
            x[i] = 0;
            r[i] = p[i] = b[i];
            rr += r[i] * r[i];
        }
        /* rr is final after the loop's barrier; every thread keeps its
         * own copy of the scalars of the iteration. */
        double my_rr = rr, bb = rr;
        int it;
        for (it = 0; it < MAXIT && sqrt(my_rr) > TOL * sqrt(bb); it++) {
#pragma omp single
            pq = 0;
#pragma omp for reduction(+ : pq) schedule(static)
            for (int i = 0; i < N; i++) {
                q[i] = row_times(a, p, i);
                pq += p[i] * q[i];
            }
            double alpha = my_rr / pq;
#pragma omp single
            rr_new = 0;
#pragma omp for reduction(+ : rr_new) schedule(static)
            for (int i = 0; i < N; i++) {
                x[i] += alpha * p[i];
                r[i] -= alpha * q[i];
                rr_new += r[i] * r[i];
            }
            double beta = rr_new / my_rr;
            my_rr = rr_new;
#pragma omp for schedule(static)
            for (int i = 0; i < N; i++)
                p[i] = r[i] + beta * p[i];
        }
#pragma omp single
        iterations = it;
    }
    free(r);
    free(p);
    free(q);
    return iterations;
}

static void cg(void)
{
    struct csr a = build_laplacian();
    double *x_true = malloc(N * sizeof *x_true), *b = malloc(N * sizeof *b);
    double *x_par = malloc(N * sizeof *x_par), *x_ser = malloc(N * sizeof *x_ser);
    for (int i = 0; i < N; i++)
        x_true[i] = 1 + (i % 7) * 0.125;
#pragma omp parallel for schedule(dynamic, 64)
    for (int i = 0; i < N; i++)
        b[i] = row_times(&a, x_true, i); /* exact */
    int it_par = cg_parallel(&a, b, x_par);
    int it_ser = cg_serial(&a, b, x_ser);
    double err_true = 0, err_ser = 0;
    for (int i = 0; i < N; i++) {
        err_true = fmax(err_true, fabs(x_par[i] - x_true[i]));
        err_ser = fmax(err_ser, fabs(x_par[i] - x_ser[i]));
    }
    CHECK(it_par < MAXIT, "cg converged");
    CHECK(abs(it_par - it_ser) <= 2, "cg iterations like the serial run");
    CHECK(err_true < 1e-6, "cg solution close to the known one");
    CHECK(err_ser < 1e-7, "cg solution close to the serial one");
    printf("cg: n=%d nnz=%d converged=%s error<1e-6=%s\n", N, a.rowptr[N],
           it_par < MAXIT ? "yes" : "no", err_true < 1e-6 ? "yes" : "no");
    free(a.rowptr);
    free(a.col);
    free(a.val);
    free(x_true);
    free(b);
    free(x_par);
    free(x_ser);
}

static void matmul(void)
{
    double(*ma)[M] = malloc(sizeof(double[M][M]));
    double(*mb)[M] = malloc(sizeof(double[M][M]));
    double(*mc)[M] = malloc(sizeof(double[M][M]));
#pragma omp parallel for collapse(2)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            ma[i][j] = (i + 2 * j) % 5 - 2;
            mb[i][j] = (i * j) % 3 - 1;
        }
#pragma omp parallel for collapse(2) schedule(dynamic, 16)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            double s = 0;
            for (int k = 0; k < M; k++)
                s += ma[i][k] * mb[k][j];
            mc[i][j] = s;
        }
    int ok = 1;
    long checksum = 0, trace = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < M; j++) {
            long s = 0;
            for (int k = 0; k < M; k++)
                s += (long)ma[i][k] * (long)mb[k][j];
            ok &= mc[i][j] == (double)s;
            checksum += s * (i + 1) - j;
            if (i == j)
                trace += s;
        }
    CHECK(ok, "matrix product equals the serial one");
    printf("matmul: m=%d trace=%ld checksum=%ld\n", M, trace, checksum);
    free(ma);
    free(mb);
    free(mc);
}

int main(void)
{
    cg();
    matmul();
    return finish();
}
