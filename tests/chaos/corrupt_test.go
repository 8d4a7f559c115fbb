package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	idem "github.com/idemkit/idem/core"
	"github.com/idemkit/idem/stores/mongostore"
	"github.com/idemkit/idem/stores/pgstore"
	"github.com/idemkit/idem/stores/redisstore"
)

// TestUnreadableRecord writes, with the store's own driver (Redis, MongoDB,
// PostgreSQL), a value under a key that its store cannot decode (a completed record whose response is
// garbage, or a foreign value), then sends the request with that key: it
// gets its own answer, 500 "stored-result-unreadable" without Retry-After
// (a retry cannot help), nothing executes, the log names the hashed key once
// however often it is retried, and deleting the key (the documented way to
// clear it) lets the next retry execute.
func TestUnreadableRecord(t *testing.T) {
	type corruption struct {
		name  string
		write func(t *testing.T, scoped, fp string) // puts the unreadable value under the key
		clear func(t *testing.T, scoped string)     // the operator's fix
	}
	ctx := context.Background()
	stores := []struct {
		name  string
		store func(t *testing.T) (idem.Store, []corruption)
	}{
		{"redis", func(t *testing.T) (idem.Store, []corruption) {
			r := startRedis(t)
			key := func(scoped string) string { return redisstore.DefaultPrefix + scoped }
			del := func(t *testing.T, scoped string) {
				if err := r.c.Del(ctx, key(scoped)).Err(); err != nil {
					t.Fatal(err)
				}
			}
			return redisstore.New(redis.NewClient(&redis.Options{Addr: r.Addr()})), []corruption{
				{"garbage-response", func(t *testing.T, scoped, fp string) {
					// A completed record ('2' lp(fingerprint) response) whose response does not decode.
					v := fmt.Sprintf("2%d:%s\xffnot a response", len(fp), fp)
					if err := r.c.Set(ctx, key(scoped), v, 0).Err(); err != nil {
						t.Fatal(err)
					}
				}, del},
				{"garbage-response-v0.1", func(t *testing.T, scoped, fp string) {
					// The same in a v0.1 hash record (fields s, f, r).
					if err := r.c.HSet(ctx, key(scoped), "s", "2", "f", fp, "r", "\xffnot a response").Err(); err != nil {
						t.Fatal(err)
					}
				}, del},
				{"foreign-string", func(t *testing.T, scoped, _ string) {
					if err := r.c.Set(ctx, key(scoped), "someone else's value", 0).Err(); err != nil {
						t.Fatal(err)
					}
				}, del},
				{"foreign-list", func(t *testing.T, scoped, _ string) {
					if err := r.c.RPush(ctx, key(scoped), "someone else's", "value").Err(); err != nil {
						t.Fatal(err)
					}
				}, del},
				{"foreign-hash", func(t *testing.T, scoped, _ string) {
					if err := r.c.HSet(ctx, key(scoped), "s", "done", "owner", "another app").Err(); err != nil {
						t.Fatal(err)
					}
				}, del},
			}
		}},
		{"mongo", func(t *testing.T) (idem.Store, []corruption) {
			f := startFerret(t)
			c, err := mongo.Connect(options.Client().ApplyURI("mongodb://" + f.Addr + "/"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
			coll := c.Database("idem").Collection("idempotency")
			s := mongostore.New(coll)
			t.Cleanup(func() { _ = s.Close() })
			del := func(t *testing.T, scoped string) {
				if _, err := coll.DeleteOne(ctx, bson.D{{Key: "_id", Value: scoped}}); err != nil {
					t.Fatal(err)
				}
			}
			put := func(t *testing.T, doc bson.D) {
				if _, err := coll.InsertOne(ctx, doc); err != nil {
					t.Fatal(err)
				}
			}
			expires := bson.NewDateTimeFromTime(time.Now().Add(time.Hour))
			return s, []corruption{
				{"garbage-response", func(t *testing.T, scoped, fp string) {
					put(t, bson.D{{Key: "_id", Value: scoped}, {Key: "state", Value: int32(2)}, {Key: "token", Value: ""},
						{Key: "fingerprint", Value: fp}, {Key: "expiresAt", Value: expires},
						{Key: "response", Value: bson.Binary{Data: []byte("\xffnot a response")}}})
				}, del},
				{"foreign-state", func(t *testing.T, scoped, fp string) {
					put(t, bson.D{{Key: "_id", Value: scoped}, {Key: "state", Value: int32(7)}, {Key: "fingerprint", Value: fp},
						{Key: "expiresAt", Value: expires}})
				}, del},
				{"wrongly-typed-state", func(t *testing.T, scoped, fp string) {
					put(t, bson.D{{Key: "_id", Value: scoped}, {Key: "state", Value: "completed"}, {Key: "fingerprint", Value: fp},
						{Key: "expiresAt", Value: expires}})
				}, del},
				{"wrongly-typed-response", func(t *testing.T, scoped, fp string) {
					put(t, bson.D{{Key: "_id", Value: scoped}, {Key: "state", Value: int32(2)}, {Key: "token", Value: ""},
						{Key: "fingerprint", Value: fp}, {Key: "expiresAt", Value: expires},
						{Key: "response", Value: bson.D{{Key: "status", Value: 201}}}})
				}, del},
			}
		}},
		{"postgres", func(t *testing.T) (idem.Store, []corruption) {
			_, schema, pool := pgDatabase(t)
			table := schema + ".idem_records"
			s := pgstore.New(pool, pgstore.WithTable(table))
			if err := s.EnsureSchema(ctx); err != nil {
				t.Fatal(err)
			}
			del := func(t *testing.T, scoped string) {
				if _, err := pool.Exec(ctx, `DELETE FROM `+table+` WHERE key = $1`, scoped); err != nil {
					t.Fatal(err)
				}
			}
			put := func(t *testing.T, scoped, fp string, state int, response []byte) {
				if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, state, token, fingerprint, response, expires_at)
VALUES ($1, $2, '', $3, $4, now() + interval '1 hour')`, scoped, state, fp, response); err != nil {
					t.Fatal(err)
				}
			}
			return s, []corruption{
				{"garbage-response", func(t *testing.T, scoped, fp string) { put(t, scoped, fp, 2, []byte("\xffnot a response")) }, del},
				{"foreign-state", func(t *testing.T, scoped, fp string) { put(t, scoped, fp, 7, nil) }, del},
			}
		}},
	}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			store, corruptions := st.store(t)
			for _, cr := range corruptions {
				t.Run(cr.name, func(t *testing.T) {
					var mu sync.Mutex
					var logs bytes.Buffer
					e, err := idem.New(store, idem.WithLogger(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logs}, nil))))
					if err != nil {
						t.Fatal(err)
					}
					defer func() { _ = e.Close(context.Background()) }()
					user, raw := "u"+hexID(), newKey()
					req := func() *idem.Request {
						return &idem.Request{Method: http.MethodPost, Path: "/v1/payments", ContentType: "application/json",
							Keys: []string{raw}, Principal: user, Body: []byte(`{"amount":1}`)}
					}
					scoped := idem.ScopedKey(user, http.MethodPost, "/v1/payments", raw)
					cr.write(t, scoped, idem.Fingerprint(http.MethodPost, "/v1/payments", "", "application/json", []byte(`{"amount":1}`)))

					for i := range 3 {
						x, resp := e.Begin(ctx, req())
						if x != nil {
							t.Fatalf("try %d: the handler would run over an unreadable record", i)
						}
						var p idem.Problem
						_ = json.Unmarshal(resp.Body, &p)
						if resp.Status != http.StatusInternalServerError || p.Type != idem.ProblemTypeBase+"stored-result-unreadable" || p.Detail == "" {
							t.Fatalf("try %d: %d %s, want 500 stored-result-unreadable", i, resp.Status, resp.Body)
						}
						if ra := resp.Header.Get("Retry-After"); ra != "" {
							t.Errorf("try %d: Retry-After %q on an answer a retry cannot change", i, ra)
						}
					}
					mu.Lock()
					l := logs.String()
					mu.Unlock()
					if n := strings.Count(l, scoped); n != 1 {
						t.Errorf("the hashed key is logged %d times over 3 tries, want once:\n%s", n, l)
					}
					cr.clear(t, scoped)
					x, resp := e.Begin(ctx, req())
					if x == nil {
						t.Fatalf("after deleting the key: %d %s, want the handler to run", resp.Status, resp.Body)
					}
					x.Finish(http.StatusCreated, nil)
				})
			}
		})
	}
}
