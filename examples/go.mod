module github.com/idemkit/idem/examples

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/gin-gonic/gin v1.12.0
	github.com/go-sql-driver/mysql v1.10.1
	github.com/gofiber/fiber/v2 v2.52.15
	github.com/gofiber/fiber/v3 v3.1.0
	github.com/idemkit/idem/adapters/idemamqp v0.1.0
	github.com/idemkit/idem/adapters/idemconnect v0.1.0
	github.com/idemkit/idem/adapters/idemecho v0.1.0
	github.com/idemkit/idem/adapters/idemechov5 v0.1.0
	github.com/idemkit/idem/adapters/idemfiber v0.1.0
	github.com/idemkit/idem/adapters/idemfiberv3 v0.1.0
	github.com/idemkit/idem/adapters/idemgin v0.1.0
	github.com/idemkit/idem/adapters/idemgrpc v0.1.0
	github.com/idemkit/idem/adapters/idemhttp v0.1.0
	github.com/idemkit/idem/adapters/idemkafka v0.1.0
	github.com/idemkit/idem/adapters/idemnats v0.1.0
	github.com/idemkit/idem/client/idemclient v0.1.0
	github.com/idemkit/idem/core v0.1.0
	github.com/idemkit/idem/observability/idemotel v0.1.0
	github.com/idemkit/idem/observability/idemui v0.1.0
	github.com/idemkit/idem/outbox v0.1.0
	github.com/idemkit/idem/stores/memstore v0.1.0
	github.com/idemkit/idem/stores/mongostore v0.1.0
	github.com/idemkit/idem/stores/mysqlstore v0.1.0
	github.com/idemkit/idem/stores/pgstore v0.1.0
	github.com/idemkit/idem/stores/redisstore v0.1.0
	github.com/idemkit/idem/tools/history v0.1.0
	github.com/jackc/pgx/v5 v5.12.0
	github.com/labstack/echo/v4 v4.16.0
	github.com/labstack/echo/v5 v5.4.4
	github.com/nats-io/nats.go v1.55.0
	github.com/prometheus/client_golang v1.25.0
	github.com/rabbitmq/amqp091-go v1.16.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kfake v0.0.0-20260918054303-01f206a7e32c
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
	go.mongodb.org/mongo-driver/v2 v2.10.0
	go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp v0.72.0
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/exporters/prometheus v0.69.0
	go.opentelemetry.io/otel/exporters/stdout/stdouttrace v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/sdk/metric v1.47.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20261110000943-09e21b237f2c
	google.golang.org/grpc v1.85.0
	google.golang.org/protobuf v1.36.12
)

require github.com/cenkalti/backoff/v5 v5.0.3 // indirect

require (
	filippo.io/edwards25519 v1.2.0 // indirect
	github.com/andybalholm/brotli v1.2.7 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/bytedance/gopkg v0.1.3 // indirect
	github.com/bytedance/sonic v1.15.0 // indirect
	github.com/bytedance/sonic/loader v0.5.0 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/cloudwego/base64x v0.1.6 // indirect
	github.com/felixge/httpsnoop v1.1.0 // indirect
	github.com/gabriel-vasile/mimetype v1.4.12 // indirect
	github.com/gin-contrib/sse v1.1.0 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/go-playground/locales v0.14.1 // indirect
	github.com/go-playground/universal-translator v0.18.1 // indirect
	github.com/go-playground/validator/v10 v10.30.1 // indirect
	github.com/goccy/go-json v0.10.5 // indirect
	github.com/goccy/go-yaml v1.19.2 // indirect
	github.com/gofiber/schema v1.7.0 // indirect
	github.com/gofiber/utils/v2 v2.0.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/idemkit/idem/adapters/idemrpc v0.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.3 // indirect
	github.com/json-iterator/go v1.1.12 // indirect
	github.com/klauspost/compress v1.20.3 // indirect
	github.com/klauspost/cpuid/v2 v2.4.0 // indirect
	github.com/labstack/gommon v0.5.0 // indirect
	github.com/leodido/go-urn v1.4.0 // indirect
	github.com/mattn/go-colorable v0.1.15 // indirect
	github.com/mattn/go-isatty v0.0.22 // indirect
	github.com/mattn/go-runewidth v0.0.16 // indirect
	github.com/modern-go/concurrent v0.0.0-20180306012644-bacd9c7ef1dd // indirect
	github.com/modern-go/reflect2 v1.0.2 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/nats-io/nkeys v0.4.16 // indirect
	github.com/nats-io/nuid v1.0.1 // indirect
	github.com/pelletier/go-toml/v2 v2.2.4 // indirect
	github.com/philhofer/fwd v1.2.0 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	github.com/prometheus/client_model v0.6.3 // indirect
	github.com/prometheus/common v0.72.0 // indirect
	github.com/prometheus/otlptranslator v1.0.0 // indirect
	github.com/prometheus/procfs v0.22.0 // indirect
	github.com/quic-go/qpack v0.6.0 // indirect
	github.com/quic-go/quic-go v0.59.1 // indirect
	github.com/rivo/uniseg v0.2.0 // indirect
	github.com/tinylib/msgp v1.6.3 // indirect
	github.com/twitchyliquid64/golang-asm v0.15.1 // indirect
	github.com/ugorji/go/codec v1.3.1 // indirect
	github.com/valyala/bytebufferpool v1.0.0 // indirect
	github.com/valyala/fasthttp v1.69.0 // indirect
	github.com/valyala/fasttemplate v1.2.2 // indirect
	github.com/xdg-go/scram v1.4.0 // indirect
	github.com/xdg-go/stringprep v1.0.4 // indirect
	github.com/youmark/pkcs8 v0.0.0-20240726163527-a2c0da244d78 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/otel/trace v1.47.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/arch v0.22.0 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/net v0.60.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	golang.org/x/time v0.15.0 // indirect
)

replace (
	github.com/idemkit/idem/adapters/idemamqp => ../adapters/idemamqp
	github.com/idemkit/idem/adapters/idemconnect => ../adapters/idemconnect
	github.com/idemkit/idem/adapters/idemecho => ../adapters/idemecho
	github.com/idemkit/idem/adapters/idemechov5 => ../adapters/idemechov5
	github.com/idemkit/idem/adapters/idemfiber => ../adapters/idemfiber
	github.com/idemkit/idem/adapters/idemfiberv3 => ../adapters/idemfiberv3
	github.com/idemkit/idem/adapters/idemgin => ../adapters/idemgin
	github.com/idemkit/idem/adapters/idemgrpc => ../adapters/idemgrpc
	github.com/idemkit/idem/adapters/idemhttp => ../adapters/idemhttp
	github.com/idemkit/idem/adapters/idemkafka => ../adapters/idemkafka
	github.com/idemkit/idem/adapters/idemnats => ../adapters/idemnats
	github.com/idemkit/idem/adapters/idemrpc => ../adapters/idemrpc
	github.com/idemkit/idem/client/idemclient => ../client/idemclient
	github.com/idemkit/idem/core => ../core
	github.com/idemkit/idem/observability/idemotel => ../observability/idemotel
	github.com/idemkit/idem/observability/idemui => ../observability/idemui
	github.com/idemkit/idem/outbox => ../outbox
	github.com/idemkit/idem/stores/memstore => ../stores/memstore
	github.com/idemkit/idem/stores/mongostore => ../stores/mongostore
	github.com/idemkit/idem/stores/mysqlstore => ../stores/mysqlstore
	github.com/idemkit/idem/stores/pgstore => ../stores/pgstore
	github.com/idemkit/idem/stores/redisstore => ../stores/redisstore
	github.com/idemkit/idem/tools/history => ../tools/history
)
