/* Task-parallel Fibonacci in its classic form: fib(n) runs fib(n-1) and
 * fib(n-2) as two tasks and waits for them (`task` + `taskwait`, no
 * cutoff: every call with n >= 2 creates two tasks), started by one thread
 * (`single`) of a parallel region. Measures the cost of task creation and
 * scheduling. Verified against the iterative value.
 *
 * Classes: S n = 30 (2,692,536 tasks), W n = 32, A n = 35. */
#include "kernel.h"

static long fib(int n)
{
    if (n < 2)
        return n;
    long a, b;
#pragma omp task shared(a) firstprivate(n)
    a = fib(n - 1);
#pragma omp task shared(b) firstprivate(n)
    b = fib(n - 2);
#pragma omp taskwait
    return a + b;
}

int main(int argc, char **argv)
{
    static const int n_of_class[] = {30, 32, 35};
    int cls = kernel_class(argc, argv, "fib");
    int n = n_of_class[cls];
    int threads = kernel_team_size();

    long value = 0;
    double t0 = omp_get_wtime();
#pragma omp parallel
    {
#pragma omp single
        value = fib(n);
    }
    double seconds = omp_get_wtime() - t0;

    long x = 0, y = 1;
    for (int i = 0; i < n; i++) {
        long t = x + y;
        x = y;
        y = t;
    }
    char details[64];
    snprintf(details, sizeof details, "n=%d value=%ld", n, value);
    return kernel_report("fib", cls, threads, seconds, value == x, details);
}
