/* Built against an installed libperseus only (its header and perseus.pc or
   find_package(Perseus)), run under the installed perseusrun: the sum of the ranks. */
#include <perseus/perseus.h>
#include <stdio.h>

int main(void) {
  if (perseus_init() != 0) {
    fprintf(stderr, "perseus_init: %s\n", perseus_last_error());
    return 1;
  }
  float mine = (float)perseus_rank(), sum = 0;
  if (perseus_allreduce(&mine, &sum, 1, PERSEUS_FLOAT32, PERSEUS_SUM, "sum") != 0) {
    fprintf(stderr, "perseus_allreduce: %s\n", perseus_last_error());
    return 1;
  }
  printf("rank %d of %d: sum %g, libperseus %d\n", perseus_rank(), perseus_size(), sum,
         perseus_version());
  return perseus_finalize() == 0 ? 0 : 1;
}
