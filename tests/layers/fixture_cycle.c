/* The layering check's own test: the other half of a cycle of files. */
int tf_fixture_high(void);
int tf_fixture_cycle(void) { return tf_fixture_high() > 0 ? 0 : 1; }
