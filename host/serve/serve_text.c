#include "serve_text.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/*
 * The well-formed byte sequences of UTF-8 (Unicode Table 3-7): from the
 * lead byte, how many bytes follow and the range of the first of them;
 * the others are 80..BF. 0 for a byte that cannot start a character.
 */
static int lead(uint8_t b, uint8_t *lo, uint8_t *hi)
{
	*lo = 0x80;
	*hi = 0xBF;
	if (b < 0x80)
		return 0;
	if (b >= 0xC2 && b <= 0xDF)
		return 1;
	if (b == 0xE0)
		*lo = 0xA0;
	else if (b == 0xED)
		*hi = 0x9F;
	if (b >= 0xE0 && b <= 0xEF)
		return 2;
	if (b == 0xF0)
		*lo = 0x90;
	else if (b == 0xF4)
		*hi = 0x8F;
	if (b >= 0xF0 && b <= 0xF4)
		return 3;
	return -1;
}

/*
 * At S[0..len): the length of the well-formed character there (1..4), or
 * minus the length of its maximal subpart (the bytes one U+FFFD replaces),
 * whose last byte may be the end of the input.
 */
static int scan(const uint8_t *s, size_t len)
{
	uint8_t lo, hi;
	int follow = lead(s[0], &lo, &hi);

	if (follow == 0)
		return 1;
	if (follow < 0)
		return -1;
	for (int i = 1; i <= follow; i++) {
		if ((size_t)i >= len || s[i] < lo || s[i] > hi)
			return -i;
		lo = 0x80;
		hi = 0xBF;
	}
	return follow + 1;
}

char *serve_utf8_clean(const char *s, size_t len, size_t *out_len)
{
	const uint8_t *u = (const uint8_t *)s;
	/* At worst every byte becomes the three bytes of U+FFFD. */
	char *out = malloc(len * 3 + 1);
	size_t n = 0;

	if (!out)
		return NULL;
	for (size_t i = 0; i < len;) {
		int k = scan(u + i, len - i);

		if (k > 0) {
			memcpy(out + n, u + i, (size_t)k);
			n += (size_t)k;
			i += (size_t)k;
		} else {
			memcpy(out + n, "\xEF\xBF\xBD", 3);
			n += 3;
			i += (size_t)-k;
		}
	}
	out[n] = 0;
	*out_len = n;
	return out;
}

size_t serve_utf8_incomplete(const char *s, size_t len)
{
	const uint8_t *u = (const uint8_t *)s;

	/* A character is at most 4 bytes: its start is among the last 3. */
	for (size_t back = 1; back <= 3 && back <= len; back++) {
		uint8_t b = u[len - back], lo, hi;
		int follow;

		if (b >= 0x80 && b <= 0xBF)
			continue; /* a continuation byte: look further back */
		follow = lead(b, &lo, &hi);
		/* A lead byte: incomplete when every byte after it fits. */
		if (follow < (int)back)
			return 0;
		return -scan(u + len - back, back) == (int)back ? back : 0;
	}
	return 0;
}

long serve_stop_find(const char *s, size_t len, size_t from, char *const *stop,
                     size_t n)
{
	long best = -1;

	for (size_t i = 0; i < n; i++) {
		size_t sl = strlen(stop[i]);
		size_t start = from >= sl ? from - sl + 1 : 0;
		const char *hit;

		if (sl == 0 || sl > len || start > len - sl)
			continue;
		hit = memmem(s + start, len - start, stop[i], sl);
		if (hit && (best < 0 || hit - s < best))
			best = hit - s;
	}
	return best;
}

size_t serve_stop_partial(const char *s, size_t len, char *const *stop, size_t n)
{
	size_t best = 0;

	for (size_t i = 0; i < n; i++) {
		size_t sl = strlen(stop[i]);

		for (size_t k = sl > 0 ? sl - 1 : 0; k > best; k--)
			if (k <= len && !memcmp(s + len - k, stop[i], k)) {
				best = k;
				break;
			}
	}
	return best;
}
