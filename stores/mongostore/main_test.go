package mongostore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/readpref"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
	"go.uber.org/goleak"
)

// The integration tests talk to the MongoDB-wire server at IDEM_MONGO_URI
// (a real MongoDB, or tools/ferretdb as `make test` starts it). Unset, they
// fail when CI=true and skip otherwise. The outage test runs its own FerretDB
// binary: IDEM_FERRETDB_BIN, or one TestMain builds from ../../tools/ferretdb.
const (
	envURI      = "IDEM_MONGO_URI"
	envFerretDB = "IDEM_FERRETDB_BIN"
	testDB      = "idem_mongostore_test"
)

var (
	ferretBin    string // path of the FerretDB binary for the outage test; "" if unavailable
	ferretBinErr error  // why it is unavailable

	sharedOnce   sync.Once
	sharedClient *mongo.Client
	sharedErr    error
	sharedFerret bool
)

func TestMain(m *testing.M) {
	var tmp string
	if ferretBin = os.Getenv(envFerretDB); ferretBin == "" && integration() {
		tmp, ferretBin, ferretBinErr = buildFerretDB()
	}
	code := m.Run()
	if sharedClient != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_ = sharedClient.Disconnect(ctx)
		cancel()
	}
	if tmp != "" {
		os.RemoveAll(tmp)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// integration reports whether the integration tests run (or must fail).
func integration() bool { return os.Getenv(envURI) != "" || os.Getenv("CI") == "true" }

func buildFerretDB() (dir, bin string, err error) {
	dir, err = os.MkdirTemp("", "mongostore-ferretdb-")
	if err != nil {
		return "", "", err
	}
	bin = filepath.Join(dir, "ferretdb")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Dir = filepath.Join("..", "..", "tools", "ferretdb")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return dir, "", fmt.Errorf("build tools/ferretdb: %w\n%s", err, out)
	}
	return dir, bin, nil
}

// uri returns the server address or ends the test: fatal under CI=true,
// skipped otherwise.
func uri(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(envURI)
	if u == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set; under CI=true the MongoDB integration tests must run", envURI)
		}
		tb.Skipf("%s is not set: run `make test` (starts tools/ferretdb), or %s=mongodb://HOST:27017/ go test ./...", envURI, envURI)
	}
	return u
}

// connect returns a new client for the test server, disconnected at cleanup.
func connect(tb testing.TB, opts ...*options.ClientOptions) *mongo.Client {
	tb.Helper()
	c, err := mongo.Connect(append([]*options.ClientOptions{options.Client().ApplyURI(uri(tb))}, opts...)...)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Disconnect(ctx)
	})
	ping(tb, c)
	return c
}

func ping(tb testing.TB, c *mongo.Client) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx, readpref.Primary()); err != nil {
		tb.Fatalf("MongoDB-wire server at %s unreachable: %v", os.Getenv(envURI), err)
	}
}

// shared returns the client shared by the tests (disconnected in TestMain)
// and whether the server is FerretDB.
func shared(tb testing.TB) (*mongo.Client, bool) {
	tb.Helper()
	u := uri(tb)
	sharedOnce.Do(func() {
		sharedClient, sharedErr = mongo.Connect(options.Client().ApplyURI(u))
		if sharedErr != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if sharedErr = sharedClient.Ping(ctx, readpref.Primary()); sharedErr != nil {
			return
		}
		sharedFerret, sharedErr = isFerretDB(ctx, sharedClient)
	})
	if sharedErr != nil {
		tb.Fatalf("MongoDB-wire server at %s: %v", u, sharedErr)
	}
	return sharedClient, sharedFerret
}

// isFerretDB tells FerretDB from MongoDB by buildInfo's ferretdbVersion field.
func isFerretDB(ctx context.Context, c *mongo.Client) (bool, error) {
	raw, err := c.Database("admin").RunCommand(ctx, bson.D{{Key: "buildInfo", Value: 1}}).Raw()
	if err != nil {
		return false, fmt.Errorf("buildInfo: %w", err)
	}
	_, err = raw.LookupErr("ferretdbVersion")
	return err == nil, nil
}

func randomName(prefix string) string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// collection returns a fresh collection with majority write concern, dropped
// at cleanup.
func collection(tb testing.TB, c *mongo.Client) *mongo.Collection {
	tb.Helper()
	coll := c.Database(testDB).Collection(randomName("t_"),
		options.Collection().SetWriteConcern(writeconcern.Majority()).SetReadPreference(readpref.Primary()))
	tb.Cleanup(func() { drop(coll) })
	return coll
}

func drop(coll *mongo.Collection) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = coll.Drop(ctx)
}

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	tb.Cleanup(cancel)
	return ctx
}
