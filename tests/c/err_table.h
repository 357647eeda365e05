/* The GPU tests' report: the worst relative error (GPU vs CPU) per check and
 * dtype, with its tolerance, printed as one table at the end. */
#ifndef TF_ERR_TABLE_H
#define TF_ERR_TABLE_H

#include <stdio.h>
#include <string.h>

#include "dtype.h"

enum { ERR_TABLE_ROWS = 256 };
static struct {
  char op[48];
  tf_dtype dtype;
  double worst, tol;
  int cases;
} err_table[ERR_TABLE_ROWS];
static int err_table_rows;

/* Notes one comparison; NaN and infinity stick as the worst. */
static void record(const char *op, tf_dtype d, double err, double tol) {
  int i = 0;
  while (i < err_table_rows && !(strcmp(err_table[i].op, op) == 0 && err_table[i].dtype == d)) i++;
  if (i == err_table_rows) {
    if (err_table_rows == ERR_TABLE_ROWS) return;
    snprintf(err_table[i].op, sizeof err_table[i].op, "%s", op);
    err_table[i].dtype = d;
    err_table_rows++;
  }
  if (!(err <= err_table[i].worst)) err_table[i].worst = err;
  err_table[i].tol = tol;
  err_table[i].cases++;
}

static void print_table(void) {
  printf("\n%-40s %-5s %6s  %-10s %s\n", "check", "dtype", "cases", "tolerance", "worst relative error, GPU vs CPU");
  for (int i = 0; i < err_table_rows; i++)
    printf("%-40s %-5s %6d  %-10.2g %.3g%s\n", err_table[i].op, tf_dtype_name(err_table[i].dtype), err_table[i].cases,
           err_table[i].tol, err_table[i].worst, err_table[i].worst <= err_table[i].tol ? "" : "  FAIL");
}

#endif
