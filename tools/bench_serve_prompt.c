/* bench_serve_prompt — prompts of random English words, reproducible from a seed.
 *
 * The words are short, common ones: in a Llama SentencePiece vocabulary (and in mkmodel's
 * generated one) most are a single token, so N words come to roughly N tokens; bench serve
 * reports the server's real prompt_tokens anyway. Each prompt has its own stream number,
 * so its text does not depend on the order in which requests happen to be sent. */
#include "tools/bench_serve_internal.h"

#include <stdlib.h>
#include <string.h>

static const char *const words[] = {
    "time", "year", "people", "way", "day", "man", "thing", "woman", "life", "child",
    "world", "school", "state", "family", "student", "group", "country", "problem", "hand",
    "part", "place", "case", "week", "company", "system", "program", "question", "work",
    "number", "night", "point", "home", "water", "room", "mother", "area", "money", "story",
    "fact", "month", "lot", "right", "study", "book", "eye", "job", "word", "business",
    "side", "kind", "head", "house", "service", "friend", "father", "power", "hour", "game",
    "line", "end", "member", "law", "car", "city", "name", "team", "minute", "idea", "kid",
    "body", "face", "door", "health", "art", "war", "history", "party", "result", "change",
    "morning", "reason", "research", "girl", "guy", "moment", "air", "teacher", "force",
    "good", "new", "first", "last", "long", "great", "little", "own", "other", "old", "big",
    "high", "different", "small", "large", "next", "early", "young", "important", "few",
    "public", "bad", "same", "able", "be", "have", "do", "say", "go", "get", "make", "know",
    "think", "take", "see", "come", "want", "look", "use", "find", "give", "tell", "call",
    "try", "ask", "need", "feel", "become", "leave", "put", "mean", "keep", "let", "begin",
    "seem", "help", "talk", "turn", "start", "show", "hear", "play", "run", "move", "like",
    "live", "believe", "bring", "happen", "write", "sit", "stand", "lose", "pay", "meet",
    "the", "of", "and", "to", "in", "for", "on", "with", "at", "by", "from", "up", "about",
    "into", "over", "after", "very", "also", "just", "well", "only", "then", "now", "here",
    "there", "when", "where", "how", "all", "some", "many", "more", "most", "much", "still",
    "tree", "river", "sun", "sky", "ball", "dog", "cat", "bird", "fish", "garden", "flower",
    "apple", "bread", "music", "light", "stone", "road", "window", "table", "paper", "blue",
    "red", "green", "happy", "quiet", "warm", "cold", "soft", "bright", "dark", "fast",
};

#define N_WORDS (int)(sizeof words / sizeof words[0])

int bs_prompt_word_count(void)
{
    return N_WORDS;
}

/* splitmix64: small, fast, and every seed gives a well-mixed sequence. */
static uint64_t next_u64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

char *bs_prompt_words(uint64_t seed, uint64_t stream, int n_words)
{
    if (n_words < 0)
        n_words = 0;
    uint64_t state = seed;
    /* Mix the stream number in through the generator so nearby streams are unrelated. */
    state ^= next_u64(&(uint64_t){stream ^ 0x5851f42d4c957f2dull});
    size_t cap = 1, longest = 0;
    for (int i = 0; i < N_WORDS; i++)
        if (strlen(words[i]) > longest)
            longest = strlen(words[i]);
    cap += (size_t)n_words * (longest + 1);
    char *out = malloc(cap);
    if (out == NULL)
        return NULL;
    size_t len = 0;
    for (int i = 0; i < n_words; i++) {
        const char *w = words[next_u64(&state) % (uint64_t)N_WORDS];
        size_t wl = strlen(w);
        if (i > 0)
            out[len++] = ' ';
        memcpy(out + len, w, wl);
        len += wl;
    }
    out[len] = '\0';
    return out;
}
