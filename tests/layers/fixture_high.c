/* The layering check's own test: the layer the lower one calls into, with
 * two files that call each other (fixture_cycle.c). */
int tf_fixture_low(void);
int tf_fixture_cycle(void);
int tf_fixture_high(void) { return 1 + tf_fixture_cycle(); }
int tf_fixture_uses_low(void) { return tf_fixture_low(); }
