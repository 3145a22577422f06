"""The fault suite: broken and hostile regions and clients, against real processes.

Issue 24's attack-run findings and where each is tested (SECURITY.md has the defences):
 1 unbounded region headers              test_hostile.py, integration/test_http1.py
 2 token limits dodged by number spelling test_hostile.py, unit/access/test_limits.py
 3 prompt text outside message text      native/test_tokens.py
 5 coalesced followers and their leader  integration/test_cache.py
 6 a never-ending SSE line               test_hostile.py, property/test_sse_props.py
 7 redirects from a region               test_hostile.py, unit/core/test_failures.py
 8 compressed request bodies             test_hostile.py
 9 normalized-cache false hits           native/test_cache_key_sets.py
11 500s for malformed bodies             unit/core/test_request.py
12 hop-by-hop and forwarding headers     test_hostile.py
13 numbers past float precision          native/test_cache_key_sets.py
14 region cookies, CORS, encodings       test_hostile.py
15 a region echoing its own key          test_hostile.py
16 duplicate keys                        unit/core/test_request.py
"""
