// A test's stand-in for a wildcard DNS record (tests/gateway/e2b/wildcard.py says the rest):
// loaded with `node --require`, it resolves DOMAIN and every name under it to ADDRESS when
// REPLGATE_TEST_WILDCARD_DNS=DOMAIN=ADDRESS is set, as a `*.DOMAIN` record would.
const dns = require('node:dns')

const [domain, address] = (process.env.REPLGATE_TEST_WILDCARD_DNS || '').split('=')
const lookup = dns.lookup

dns.lookup = function (hostname, ...rest) {
  if (domain && typeof hostname === 'string' &&
      (hostname === domain || hostname.endsWith(`.${domain}`))) {
    hostname = address
  }
  return lookup.call(this, hostname, ...rest)
}
