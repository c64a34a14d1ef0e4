/* The prefix hash of a full block: parent hash, salt, token count and tokens absorbed
 * into a 64-bit state, one 64-bit word (two tokens) at a time.
 *
 * Each absorb step is state = mix64(state ^ word) + golden: a bijection of the state for
 * a fixed word and of the word for a fixed state, so inputs that share all words but one
 * never collide, and mix64's avalanche spreads every input bit over the whole state.
 * Tokens enter as their 32-bit patterns, composed arithmetically (same hash on any byte
 * order). 0 is reserved to mean "no hash", so a result of 0 becomes 1.
 *
 * Not cryptographic: whoever knows the salt could search for colliding prompts. Callers
 * serving untrusted users fold a per-process random secret into the salt.
 */
#include "paging/paging_internal.h"

#define HASH_GOLDEN 0x9e3779b97f4a7c15ULL /* 2^64 / phi: odd, well spread bits */
#define HASH_START  0x70616765645f6b76ULL /* "paged_kv": any fixed start state */

static inline uint64_t hash_absorb(uint64_t state, uint64_t word)
{
    return paging_mix64(state ^ word) + HASH_GOLDEN;
}

BlockHash block_hash_chain(BlockHash parent, const int32_t *tokens, int n_tokens, uint64_t salt)
{
    if (n_tokens < 0)
        paging_panic("block_hash_chain: n_tokens = %d", n_tokens);
    uint64_t h = hash_absorb(HASH_START, parent);
    h = hash_absorb(h, salt);
    h = hash_absorb(h, (uint64_t)(uint32_t)n_tokens);
    int i = 0;
    for (; i + 1 < n_tokens; i += 2) {
        uint64_t word = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        h = hash_absorb(h, word);
    }
    if (i < n_tokens)
        h = hash_absorb(h, (uint64_t)(uint32_t)tokens[i]);
    h = paging_mix64(h);
    return h != 0 ? h : 1;
}
