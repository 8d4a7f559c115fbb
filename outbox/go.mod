module github.com/idemkit/idem/outbox

go 1.24

require github.com/cenkalti/backoff/v5 v5.0.3
