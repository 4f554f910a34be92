/* Dense matrix multiply C = A B of n x n doubles, rows of C shared out by
 * `parallel for` (static schedule; i-k-j loop order, so the inner loop runs
 * along rows of B and C). The matrices hold small integers, so every
 * product is exact in doubles and the check is exact: Freivalds' test
 * C v == A (B v) for two test vectors v, computed serially. Only the
 * product is timed. */
#include "kernel.h"

/* Two test vectors for Freivalds' check, of integers and of halves, with
 * no zero entry (so a single wrong entry of C always shows); all sums stay
 * exact in doubles. */
static double test_vector(int which, long j)
{
    return which == 0 ? (double)(j % 3) + 1.0 : (double)((j * 7 + 3) % 11) - 5.5;
}

int main(int argc, char **argv)
{
    static const long n_of_class[] = {600, 1200, 2000};
    int cls = kernel_class(argc, argv, "matmul");
    long n = n_of_class[cls];
    int threads = kernel_team_size();

    double *a = malloc(n * n * sizeof *a), *b = malloc(n * n * sizeof *b),
           *c = malloc(n * n * sizeof *c);
    for (long i = 0; i < n; i++)
        for (long j = 0; j < n; j++) {
            a[i * n + j] = (double)((i * 3 + j * 5) % 7) - 3.0;
            b[i * n + j] = (double)((i * 2 + j * 7 + 1) % 5) - 2.0;
        }

    double t0 = omp_get_wtime();
#pragma omp parallel for schedule(static)
    for (long i = 0; i < n; i++) {
        double *ci = c + i * n;
        for (long j = 0; j < n; j++)
            ci[j] = 0.0;
        for (long k = 0; k < n; k++) {
            double aik = a[i * n + k];
            const double *bk = b + k * n;
            for (long j = 0; j < n; j++)
                ci[j] += aik * bk[j];
        }
    }
    double seconds = omp_get_wtime() - t0;

    /* Freivalds: C v == A (B v), exactly. */
    double *v = malloc(n * sizeof *v), *bv = malloc(n * sizeof *bv);
    long wrong = 0;
    double checksum = 0;
    for (int which = 0; which < 2; which++) {
        for (long j = 0; j < n; j++)
            v[j] = test_vector(which, j);
        for (long i = 0; i < n; i++) {
            double s = 0;
            for (long j = 0; j < n; j++)
                s += b[i * n + j] * v[j];
            bv[i] = s;
        }
        for (long i = 0; i < n; i++) {
            double cv = 0, abv = 0;
            for (long j = 0; j < n; j++) {
                cv += c[i * n + j] * v[j];
                abv += a[i * n + j] * bv[j];
            }
            wrong += cv != abv;
            checksum += cv;
        }
    }
    char details[96];
    snprintf(details, sizeof details, "n=%ld checksum=%.0f wrong_rows=%ld", n,
             checksum, wrong);
    free(a);
    free(b);
    free(c);
    free(v);
    free(bv);
    return kernel_report("matmul", cls, threads, seconds, wrong == 0, details);
}
