package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/lockgate/lockgate/admin"
	"github.com/lockgate/lockgate/config"
	"github.com/lockgate/lockgate/docid"
	"github.com/lockgate/lockgate/lockstore"
	"github.com/lockgate/lockgate/namespace"
	"github.com/lockgate/lockgate/policy"
	"go.mongodb.org/mongo-driver/bson"
	"go.uber.org/zap"
)

// lockView is one held lock as the admin listener shows it. It never shows
// a session id: its holder is named by the holder tag, as in refusals,
// lockStatus and the acquire reply.
type lockView struct {
	NS        string      `json:"namespace"`
	ID        any         `json:"id"`
	Holder    *holderView `json:"holder"` // null when the lock is free
	Held      bool        `json:"held"`
	Since     time.Time   `json:"since,omitzero"`
	ExpiresAt time.Time   `json:"expiresAt,omitzero"`
	Token     int64       `json:"token"`
	LastError string      `json:"lastError,omitempty"`
	// Implicit marks a lock the proxy holds for a writer that holds no
	// lock of its own (unlockedWriters), while its write Command runs.
	Implicit bool   `json:"implicit,omitempty"`
	Command  string `json:"command,omitempty"`
	// Key is the _id as canonical extended JSON, in a string: what
	// POST /locks/release takes back as "key" to name exactly this lock.
	// ID is the same value as relaxed extended JSON, which a JSON parser
	// may change (JavaScript rounds integers past 2^53, and orders object
	// keys that look like array indexes first), so a client that sends
	// back what it parsed can name another lock.
	Key string `json:"key,omitempty"`
}

// holderView is a lock's holder, with the same keys as the holder
// document of refusals and lockStatus.
type holderView struct {
	App    string `json:"app"`
	Tag    string `json:"tag"` // the holder tag: a prefix of the keyed owner hash, not of the session id
	Client string `json:"client,omitempty"`
	User   string `json:"user,omitempty"`
}

func viewOf(st lockstore.Status) lockView {
	v := lockView{
		NS: st.NS.String(), ID: extJSON(st.ID.Raw()), Held: st.Held, Token: st.Token, LastError: st.LastError,
	}
	if st.ID.IsZero() {
		v.ID = "<invalid>" // a damaged record's id, which is no _id
	} else if k, ok := extJSONText(st.ID.Raw(), true); ok {
		v.Key = k
	}
	if st.Held {
		v.Holder = &holderView{App: st.Holder.App, Tag: st.Holder.SessionPrefix, Client: st.Holder.Client, User: st.Holder.User}
		v.Since, v.ExpiresAt = st.Since, st.ExpiresAt
		v.Implicit, v.Command = st.Holder.Implicit != "", st.Holder.Implicit
	}
	return v
}

// extJSON renders an _id as relaxed extended JSON, so that 1, NumberLong(1)
// and "1" stay distinguishable in the view.
func extJSON(v bson.RawValue) any {
	s, ok := extJSONText(v, false)
	if !ok {
		return v.String()
	}
	return json.RawMessage(s)
}

// extJSONText renders one value as extended JSON text, canonical or
// relaxed, with its document keys in their stored order.
func extJSONText(v bson.RawValue, canonical bool) (string, bool) {
	doc, err := bson.Marshal(bson.D{{Key: "v", Value: v}})
	if err != nil {
		return "", false
	}
	out, err := bson.MarshalExtJSON(bson.Raw(doc), canonical, false)
	if err != nil {
		return "", false
	}
	// {"v":<value>}: the value is the text between the first colon and
	// the closing brace. Not decoded into a map, which would reorder
	// nothing here but is one more parser between the lock and its name.
	const head = `{"v":`
	if len(out) < len(head)+1 || string(out[:len(head)]) != head || out[len(out)-1] != '}' {
		return "", false
	}
	return string(out[len(head) : len(out)-1]), true
}

// mountViews adds the lock and policy views and the force-release action.
// beginForce, if set, marks an operator's force-release under way and
// waits for the writes in flight under the lock before it frees it; the
// func it returns ends the mark once the lock store has answered.
//
// forced, when set, is told of every lock an operator force-released (the
// audit trail records it).
func mountViews(adm *admin.Server, store *lockstore.Store, pol func() *policy.Policy, warnings func() []string, token string, log *zap.Logger, beginForce func(context.Context, namespace.Namespace, docid.ID) (func(), error),
	forced func(ns namespace.Namespace, id docid.ID, reason, remote string, before lockstore.Status)) {
	adm.Handle("/locks", admin.JSON(func(r *http.Request) (any, error) {
		q := r.URL.Query()
		limit, err := queryLimit(q.Get("limit"))
		if err != nil {
			return nil, err
		}
		ns, err := queryNS(q.Get("ns"))
		if err != nil {
			return nil, err
		}
		sts, err := store.List(r.Context(), lockstore.ListOptions{NS: ns, Limit: limit, IncludeFree: q.Get("all") == "1"})
		if err != nil {
			return nil, err
		}
		views := make([]lockView, len(sts))
		for i, st := range sts {
			views[i] = viewOf(st)
		}
		return map[string]any{"locks": views}, nil
	}))
	adm.Handle("/policy", admin.JSON(func(*http.Request) (any, error) {
		p := pol()
		if p == nil {
			return nil, errors.New("no policy loaded")
		}
		rules, fallback := p.Rules()
		views := make([]ruleView, len(rules))
		for i, r := range rules {
			views[i] = viewOfRule(r)
		}
		return map[string]any{"version": p.Version(), "default": viewOfRule(fallback), "namespaces": views,
			"allowSessionIntrospection": p.SessionIntrospection(), "warnings": warnings()}, nil
	}))
	adm.HandleAction("/locks/release", token, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			NS     string          `json:"namespace"`
			ID     json.RawMessage `json:"id"`
			Key    *string         `json:"key"`
			Reason string          `json:"reason"`
			// Token, when sent, pins the holding the operator saw (a
			// number, or a string for clients whose numbers cannot hold
			// 64 bits): a lock that changed hands since is not released.
			Token json.RawMessage `json:"token"`
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if err == nil {
			err = json.Unmarshal(body, &req)
		}
		if err != nil || req.NS == "" || (len(req.ID) == 0) == (req.Key == nil) || req.Reason == "" {
			admin.WriteJSON(w, http.StatusBadRequest, map[string]string{
				"error": `want {"namespace": "db.coll", "id": <_id as extended JSON>, "reason": "why"}, or "key": <the lock's key from GET /locks> instead of "id"`})
			return
		}
		ns, ok := namespace.Parse(req.NS)
		if !ok {
			admin.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("namespace: want \"db.coll\", got %q", req.NS)})
			return
		}
		// A key is extended JSON in a string, so that no client's JSON
		// parser comes between the lock listed and the lock released.
		if req.Key != nil {
			if !json.Valid([]byte(*req.Key)) {
				admin.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "key: not one extended JSON value; send the key as GET /locks gives it"})
				return
			}
			req.ID = json.RawMessage(*req.Key)
		}
		id, err := parseExtJSONValue(req.ID)
		if err != nil {
			admin.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "id: " + err.Error()})
			return
		}
		token, pinned, err := parseToken(req.Token)
		if err != nil {
			admin.WriteJSON(w, http.StatusBadRequest, map[string]string{"error": "token: " + err.Error()})
			return
		}
		if beginForce != nil {
			done, err := beginForce(r.Context(), ns, id)
			defer done()
			if err != nil {
				admin.WriteJSON(w, http.StatusConflict, map[string]string{"error": "a write this proxy forwarded (or is about to forward) under the lock is still unanswered; the lock stays: retry"})
				return
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		var before lockstore.Status
		if pinned {
			before, err = store.ForceReleaseOf(ctx, ns, id, token, req.Reason)
		} else {
			before, err = store.ForceRelease(ctx, ns, id, req.Reason)
		}
		if errors.Is(err, lockstore.ErrChangedHands) {
			admin.WriteJSON(w, http.StatusConflict, map[string]any{"released": false, "error": err.Error()})
			return
		}
		if errors.Is(err, lockstore.ErrHeldInMemory) {
			// A legacy write's lock held in memory outlasted the wait:
			// the error says by when it ends by itself.
			admin.WriteJSON(w, http.StatusConflict, map[string]any{"released": false, "error": err.Error()})
			return
		}
		if err != nil {
			admin.WriteJSON(w, http.StatusBadGateway, map[string]string{"error": err.Error()})
			return
		}
		if !before.Held {
			// Nothing was released: say so, and point at the likely
			// mistake, an _id of another type than the lock's.
			msg := fmt.Sprintf("no lock is held on _id %s in %s; nothing was released", id, ns)
			if alt, ok := heldAsOtherType(ctx, store, ns, id); ok {
				msg += fmt.Sprintf("; a lock is held on _id %s, of another type: send the id with its type in extended JSON (e.g. {\"$numberInt\": \"42\"} or \"42\")", alt)
			}
			admin.WriteJSON(w, http.StatusNotFound, map[string]any{"released": false, "error": msg})
			return
		}
		log.Warn("operator force-released a lock", zap.String("ns", ns.String()), zap.String("id", id.String()),
			zap.String("reason", req.Reason), zap.String("remote", r.RemoteAddr),
			zap.Bool("wasHeld", before.Held), zap.String("holderApp", before.Holder.App),
			zap.String("holder", before.Holder.SessionPrefix))
		if forced != nil {
			forced(ns, id, req.Reason, r.RemoteAddr, before)
		}
		admin.WriteJSON(w, http.StatusOK, map[string]any{"released": before.Held, "before": viewOf(before)})
	}))
}

// parseToken reads the optional fencing token of a force-release: a JSON
// integer or a string of one; pinned is false when none was sent.
func parseToken(raw json.RawMessage) (token int64, pinned bool, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, false, nil
	}
	text := string(raw)
	var s string
	if json.Unmarshal(raw, &s) == nil {
		text = s
	}
	token, err = strconv.ParseInt(text, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("want the lock's token as GET /locks gives it, an integer (or a string of one): %s", raw)
	}
	return token, true, nil
}

// heldAsOtherType finds a held lock in ns whose _id is id written as
// another type ("42" for 42, or 42 for "42").
func heldAsOtherType(ctx context.Context, store *lockstore.Store, ns namespace.Namespace, id docid.ID) (docid.ID, bool) {
	sts, err := store.List(ctx, lockstore.ListOptions{NS: ns, Limit: 10000})
	if err != nil {
		return docid.ID{}, false
	}
	text := id.String()
	for _, st := range sts {
		if st.Held && st.ID.Type() != id.Type() && strings.Trim(st.ID.String(), `"`) == strings.Trim(text, `"`) {
			return st.ID, true
		}
	}
	return docid.ID{}, false
}

// ruleView is a policy rule as the configuration spells it, so that what
// /policy shows can be compared with the file key by key.
type ruleView struct {
	Match                          string `json:"match"`
	Mode                           string `json:"mode"`
	Inserts                        string `json:"inserts"`
	AllowCollectionWrites          bool   `json:"allowCollectionWrites"`
	AllowCappedInserts             bool   `json:"allowCappedInserts"`
	MaxCandidates                  int    `json:"maxCandidates"`
	LeaseMarginMS                  int64  `json:"leaseMarginMS"`
	RefuseLocksOnMissingCollection bool   `json:"refuseLocksOnMissingCollection"`

	Fence      string `json:"fence"`
	FenceField string `json:"fenceField,omitempty"`
	// Scheme, Clients and OtherClients appear only when the rule sets them.
	Scheme       *schemeView  `json:"scheme,omitempty"`
	Clients      *clientsView `json:"clients,omitempty"`
	OtherClients string       `json:"otherClients,omitempty"`
	// The unlockedWriters keys appear only where they are not refuse.
	UnlockedWriters             string `json:"unlockedWriters,omitempty"`
	OtherClientsUnlockedWriters string `json:"otherClientsUnlockedWriters,omitempty"`
	UnlockedWaitMS              int64  `json:"unlockedWaitMS,omitempty"`
}

type schemeView struct {
	Type         string `json:"type"`
	Field        string `json:"field,omitempty"`
	TimeField    string `json:"timeField,omitempty"`
	ActorField   string `json:"actorField,omitempty"`
	ExpiresField string `json:"expiresField,omitempty"`
	HolderField  string `json:"holderField,omitempty"`
	LeaseMS      int64  `json:"leaseMS,omitempty"`
	Holder       string `json:"holder,omitempty"`
	Collection   string `json:"collection,omitempty"`
	TsField      string `json:"tsField,omitempty"`
	AidField     string `json:"aidField,omitempty"`
}

type clientsView struct {
	AppNames []string `json:"appNames,omitempty"`
	Users    []string `json:"users,omitempty"`
	Networks []string `json:"networks,omitempty"`
}

func viewOfRule(r policy.Rule) ruleView {
	v := ruleView{
		Match: r.Match, Mode: string(r.Mode), Inserts: string(r.Inserts),
		AllowCollectionWrites: r.AllowCollectionWrites, AllowCappedInserts: r.AllowCappedInserts, MaxCandidates: r.MaxCandidates,
		LeaseMarginMS:                  r.LeaseMargin.Milliseconds(),
		RefuseLocksOnMissingCollection: r.RefuseLocksOnMissingCollection,
	}
	v.Fence = string(config.FenceNone)
	if r.FenceField != "" {
		v.Fence, v.FenceField = string(config.FenceDocument), r.FenceField
	}
	if s := r.Scheme; s.Active() {
		sv := &schemeView{Type: string(s.Type), Field: s.LockPath, TimeField: s.TimePath, Holder: string(s.Holder),
			Collection: s.LockColl, TsField: s.TsPath, AidField: s.AidPath}
		if s.ExpiresPath != "" {
			sv.ActorField = strings.TrimPrefix(s.ActorPath, s.LockPath+".")
			sv.HolderField = strings.TrimPrefix(s.HolderPath, s.LockPath+".")
			sv.ExpiresField = strings.TrimPrefix(s.ExpiresPath, s.LockPath+".")
		} else {
			sv.LeaseMS = s.Lease.Milliseconds()
		}
		v.Scheme = sv
	}
	if c := r.Clients; c != nil {
		cv := &clientsView{AppNames: c.AppNames, Users: c.Users}
		for _, n := range c.Networks {
			cv.Networks = append(cv.Networks, n.String())
		}
		v.Clients, v.OtherClients = cv, string(c.Others)
		if c.OthersUnlocked != config.UnlockedRefuse {
			v.OtherClientsUnlockedWriters = string(c.OthersUnlocked)
		}
	}
	if r.Unlocked != "" && r.Unlocked != config.UnlockedRefuse {
		v.UnlockedWriters = string(r.Unlocked)
	}
	if r.Unlocked == config.UnlockedWait || v.OtherClientsUnlockedWriters == string(config.UnlockedWait) {
		v.UnlockedWaitMS = r.UnlockedWait.Milliseconds()
	}
	return v
}

// queryLimit reads /locks?limit=N: empty means the store's default; any
// other value must be a positive whole number, or the request fails with a
// message instead of silently showing something else.
// queryNS reads the namespace filter of a view: none ("") for all.
func queryNS(s string) (namespace.Namespace, error) {
	if s == "" {
		return namespace.Namespace{}, nil
	}
	n, ok := namespace.Parse(s)
	if !ok {
		return namespace.Namespace{}, admin.BadRequest(fmt.Errorf("ns=%q: want \"db.coll\"", s))
	}
	return n, nil
}

func queryLimit(s string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, admin.BadRequest(fmt.Errorf("limit=%q: want a positive whole number", s))
	}
	return n, nil
}

// parseExtJSONValue reads one extended-JSON value ({"$numberLong": "1"},
// {"$oid": "..."}, 1, "x").
func parseExtJSONValue(raw json.RawMessage) (docid.ID, error) {
	var doc bson.Raw
	if err := bson.UnmarshalExtJSON([]byte(fmt.Sprintf(`{"v": %s}`, raw)), false, &doc); err != nil {
		return docid.ID{}, err
	}
	return docid.New(doc.Lookup("v"))
}
