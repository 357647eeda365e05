/* The layering check's own test: a lower layer that calls up. */
int tf_fixture_high(void);
int tf_fixture_low(void) { return tf_fixture_high() + 1; }
