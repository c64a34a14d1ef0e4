/* unicode_class — which of letter, number, White_Space or other a code point is. */
#include "model/unicode_class.h"

#include <stdbool.h>

/* The White_Space property (PropList.txt): few enough to list. */
static bool is_white_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f ||
           cp == 0x205f || cp == 0x3000;
}

bool unicode_in_ranges(const UnicodeRange *r, size_t n, uint32_t cp)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (cp < r[mid].first)
            hi = mid;
        else if (cp > r[mid].last)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

UnicodeClass unicode_class(uint32_t cp)
{
    if (cp < 0x80) { /* ASCII, the common case, without a search */
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return UCLASS_LETTER;
        if (cp >= '0' && cp <= '9') return UCLASS_NUMBER;
        return is_white_space(cp) ? UCLASS_SPACE : UCLASS_OTHER;
    }
    if (is_white_space(cp)) return UCLASS_SPACE;
    if (unicode_in_ranges(unicode_letters, unicode_letters_count, cp)) return UCLASS_LETTER;
    if (unicode_in_ranges(unicode_numbers, unicode_numbers_count, cp)) return UCLASS_NUMBER;
    return UCLASS_OTHER;
}

bool unicode_is_punct(uint32_t cp)
{
    return unicode_in_ranges(unicode_punct, unicode_punct_count, cp);
}
