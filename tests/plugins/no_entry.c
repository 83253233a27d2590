/*
 * Test plugin: a valid shared object that exports no q4kh_plugin_entry_vN
 * symbol at all, only an unrelated function.
 */
int q4kh_test_not_an_entry(void);

int q4kh_test_not_an_entry(void)
{
	return 42;
}
