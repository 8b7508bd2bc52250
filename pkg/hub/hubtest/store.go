package hubtest

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	jsonpatch "github.com/evanphx/json-patch/v5"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
)

// Store is an in-memory API server for typed objects, as fast as a map:
// no JSON round trip per read (controller-runtime's fake client spends
// milliseconds per call, which made a model test of thousands of steps take
// minutes). It keeps what the provider's code relies on: resourceVersions
// and conflicts on Update and on an optimistically locked Patch, UID
// preconditions and finalizers on Delete, field indexes and label
// selectors on List. Methods it does not implement panic (nil embedded
// interface), so a test never silently depends on one.
type Store struct {
	client.WithWatch
	scheme  *runtime.Scheme
	mapper  meta.RESTMapper
	indexes map[schema.GroupVersionKind]map[string]client.IndexerFunc

	mu   sync.Mutex
	rv   int64
	uid  int64
	objs map[schema.GroupVersionKind]map[types.NamespacedName]client.Object
	// clock is the API server's clock: creation and deletion timestamps,
	// and the time of a field manager's managedFields entry on each of
	// its writes (time.Now when unset).
	clock func() time.Time
}

// SetClock sets the API server's clock.
func (s *Store) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clock = now
}

// now is the API server's time, in whole seconds as it serializes it.
func (s *Store) now() metav1.Time {
	t := time.Now()
	if s.clock != nil {
		t = s.clock()
	}
	return metav1.NewTime(t.UTC().Truncate(time.Second))
}

// touch records a write of manager on t, as the API server's field manager
// does: the entry of (manager, Update) gets the server's time. Only writes
// that name a field manager are recorded.
func (s *Store) touch(t client.Object, manager string) {
	if manager == "" {
		return
	}
	now := s.now()
	entries := t.GetManagedFields()
	for i := range entries {
		if entries[i].Manager == manager && entries[i].Operation == metav1.ManagedFieldsOperationUpdate && entries[i].Subresource == "" {
			entries[i].Time = &now
			t.SetManagedFields(entries)
			return
		}
	}
	t.SetManagedFields(append(entries, metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Time: &now}))
}

// NewStore returns an empty store; indexes are keyed by field name per kind.
func NewStore(scheme *runtime.Scheme, mapper meta.RESTMapper) *Store {
	return &Store{scheme: scheme, mapper: mapper, indexes: map[schema.GroupVersionKind]map[string]client.IndexerFunc{},
		objs: map[schema.GroupVersionKind]map[types.NamespacedName]client.Object{}}
}

// Index makes List answer MatchingFields{field: v} for obj's kind.
func (s *Store) Index(obj client.Object, field string, extract client.IndexerFunc) {
	gvk := s.gvk(obj)
	if s.indexes[gvk] == nil {
		s.indexes[gvk] = map[string]client.IndexerFunc{}
	}
	s.indexes[gvk][field] = extract
}

// Snapshot returns a copy of the store as it is now (a cache's view).
func (s *Store) Snapshot() *Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := &Store{scheme: s.scheme, mapper: s.mapper, indexes: s.indexes, rv: s.rv, uid: s.uid, clock: s.clock,
		objs: make(map[schema.GroupVersionKind]map[types.NamespacedName]client.Object, len(s.objs))}
	for gvk, objs := range s.objs {
		m := make(map[types.NamespacedName]client.Object, len(objs))
		for k, o := range objs {
			m[k] = o // stored objects are never modified in place
		}
		out.objs[gvk] = m
	}
	return out
}

func (s *Store) gvk(obj runtime.Object) schema.GroupVersionKind {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		return u.GroupVersionKind()
	}
	gvk, err := apiutil.GVKForObject(obj, s.scheme)
	if err != nil {
		panic(fmt.Sprintf("hubtest: %T: %v", obj, err))
	}
	return gvk
}

func (s *Store) notFound(gvk schema.GroupVersionKind, name string) error {
	return apierrors.NewNotFound(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, name)
}

func (s *Store) conflict(gvk schema.GroupVersionKind, name string) error {
	return apierrors.NewConflict(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, name,
		fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
}

// into copies a stored object into out (typed or unstructured).
func (s *Store) into(stored client.Object, out runtime.Object) error {
	if u, ok := out.(*unstructured.Unstructured); ok {
		gvk := u.GroupVersionKind()
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(stored)
		if err != nil {
			return err
		}
		u.Object = m
		u.SetGroupVersionKind(gvk)
		return nil
	}
	reflect.ValueOf(out).Elem().Set(reflect.ValueOf(stored.DeepCopyObject()).Elem())
	return nil
}

// typed returns a typed copy of obj to store.
func (s *Store) typed(obj client.Object) (client.Object, schema.GroupVersionKind, error) {
	gvk := s.gvk(obj)
	if u, ok := obj.(*unstructured.Unstructured); ok {
		t, err := s.scheme.New(gvk)
		if err != nil {
			return nil, gvk, err
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, t); err != nil {
			return nil, gvk, err
		}
		return t.(client.Object), gvk, nil
	}
	return obj.DeepCopyObject().(client.Object), gvk, nil
}

func (s *Store) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	gvk := s.gvk(obj)
	stored, ok := s.objs[gvk][key]
	if !ok {
		return s.notFound(gvk, key.Name)
	}
	return s.into(stored, obj)
}

func (s *Store) List(_ context.Context, list client.ObjectList, opts ...client.ListOption) error {
	o := (&client.ListOptions{}).ApplyOptions(opts)
	gvk := s.gvk(list)
	gvk.Kind = strings.TrimSuffix(gvk.Kind, "List")
	s.mu.Lock()
	defer s.mu.Unlock()
	var keys []types.NamespacedName
	for k := range s.objs[gvk] {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].Namespace != keys[j].Namespace {
			return keys[i].Namespace < keys[j].Namespace
		}
		return keys[i].Name < keys[j].Name
	})
	var items []runtime.Object
	for _, k := range keys {
		stored := s.objs[gvk][k]
		if o.Namespace != "" && k.Namespace != o.Namespace {
			continue
		}
		if o.LabelSelector != nil && !o.LabelSelector.Matches(labelSet(stored.GetLabels())) {
			continue
		}
		if o.FieldSelector != nil && !s.fieldsMatch(gvk, stored, o) {
			continue
		}
		items = append(items, stored.DeepCopyObject())
	}
	if u, ok := list.(*unstructured.UnstructuredList); ok {
		u.Items = nil
		for _, it := range items {
			m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(it)
			if err != nil {
				return err
			}
			obj := unstructured.Unstructured{Object: m}
			obj.SetGroupVersionKind(gvk)
			u.Items = append(u.Items, obj)
		}
		return nil
	}
	return meta.SetList(list, items)
}

type labelSet map[string]string

func (l labelSet) Has(k string) bool              { _, ok := l[k]; return ok }
func (l labelSet) Get(k string) string            { return l[k] }
func (l labelSet) Lookup(k string) (string, bool) { v, ok := l[k]; return v, ok }

func (s *Store) fieldsMatch(gvk schema.GroupVersionKind, obj client.Object, o *client.ListOptions) bool {
	for _, req := range o.FieldSelector.Requirements() {
		extract, ok := s.indexes[gvk][req.Field]
		if !ok {
			panic(fmt.Sprintf("hubtest: no index %q on %s", req.Field, gvk.Kind))
		}
		found := false
		for _, v := range extract(obj) {
			found = found || v == req.Value
		}
		if !found {
			return false
		}
	}
	return true
}

func (s *Store) nextRV() string {
	s.rv++
	return strconv.FormatInt(s.rv, 10)
}

func (s *Store) Create(_ context.Context, obj client.Object, opts ...client.CreateOption) error {
	o := (&client.CreateOptions{}).ApplyOptions(opts)
	t, gvk, err := s.typed(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := client.ObjectKeyFromObject(t)
	if _, ok := s.objs[gvk][key]; ok {
		return apierrors.NewAlreadyExists(schema.GroupResource{Group: gvk.Group, Resource: strings.ToLower(gvk.Kind) + "s"}, key.Name)
	}
	if t.GetUID() == "" {
		s.uid++
		t.SetUID(types.UID(fmt.Sprintf("store-uid-%d", s.uid)))
	}
	if ts := t.GetCreationTimestamp(); ts.IsZero() {
		t.SetCreationTimestamp(s.now())
	}
	s.touch(t, o.FieldManager)
	t.SetResourceVersion(s.nextRV())
	if s.objs[gvk] == nil {
		s.objs[gvk] = map[types.NamespacedName]client.Object{}
	}
	s.objs[gvk][key] = t
	return s.into(t, obj)
}

// put stores t in place of stored (same key), or removes it when it is
// being deleted and has no finalizer left. Called with the lock held.
func (s *Store) put(gvk schema.GroupVersionKind, stored, t client.Object, out client.Object) error {
	key := client.ObjectKeyFromObject(stored)
	t.SetUID(stored.GetUID())
	t.SetCreationTimestamp(stored.GetCreationTimestamp())
	if stored.GetDeletionTimestamp() != nil {
		t.SetDeletionTimestamp(stored.GetDeletionTimestamp())
	}
	t.SetResourceVersion(s.nextRV())
	if t.GetDeletionTimestamp() != nil && len(t.GetFinalizers()) == 0 {
		delete(s.objs[gvk], key)
	} else {
		s.objs[gvk][key] = t
	}
	return s.into(t, out)
}

func (s *Store) Update(_ context.Context, obj client.Object, opts ...client.UpdateOption) error {
	o := (&client.UpdateOptions{}).ApplyOptions(opts)
	t, gvk, err := s.typed(obj)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, ok := s.objs[gvk][client.ObjectKeyFromObject(t)]
	if !ok {
		return s.notFound(gvk, t.GetName())
	}
	if rv := t.GetResourceVersion(); rv != "" && rv != stored.GetResourceVersion() {
		return s.conflict(gvk, t.GetName())
	}
	t.SetManagedFields(stored.GetManagedFields())
	s.touch(t, o.FieldManager)
	return s.put(gvk, stored, t, obj)
}

func (s *Store) Patch(_ context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	manager := (&client.PatchOptions{}).ApplyOptions(opts).FieldManager
	if patch.Type() != types.MergePatchType && patch.Type() != types.JSONPatchType {
		panic(fmt.Sprintf("hubtest: patch type %s", patch.Type()))
	}
	data, err := patch.Data(obj)
	if err != nil {
		return err
	}
	gvk := s.gvk(obj)
	s.mu.Lock()
	defer s.mu.Unlock()
	stored, ok := s.objs[gvk][client.ObjectKeyFromObject(obj)]
	if !ok {
		return s.notFound(gvk, obj.GetName())
	}
	if patch.Type() == types.JSONPatchType {
		return s.applyJSONPatch(gvk, stored, data, obj, manager)
	}
	// A resourceVersion in the patch is a precondition (optimistic lock).
	var lock struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(data, &lock); err != nil {
		return err
	}
	if rv := lock.Metadata.ResourceVersion; rv != "" && rv != stored.GetResourceVersion() {
		return s.conflict(gvk, obj.GetName())
	}
	current, err := json.Marshal(stored)
	if err != nil {
		return err
	}
	merged, err := jsonpatch.MergePatch(current, data)
	if err != nil {
		return err
	}
	t, err := s.scheme.New(gvk)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(merged, t); err != nil {
		return err
	}
	s.touch(t.(client.Object), manager)
	return s.put(gvk, stored, t.(client.Object), obj)
}

func (s *Store) Delete(_ context.Context, obj client.Object, opts ...client.DeleteOption) error {
	o := (&client.DeleteOptions{}).ApplyOptions(opts)
	gvk := s.gvk(obj)
	s.mu.Lock()
	defer s.mu.Unlock()
	key := client.ObjectKeyFromObject(obj)
	stored, ok := s.objs[gvk][key]
	if !ok {
		return s.notFound(gvk, key.Name)
	}
	if p := o.Preconditions; p != nil && p.UID != nil && *p.UID != stored.GetUID() {
		return s.conflict(gvk, key.Name)
	}
	if len(stored.GetFinalizers()) == 0 {
		delete(s.objs[gvk], key)
		return nil
	}
	if stored.GetDeletionTimestamp() != nil {
		return nil
	}
	t := stored.DeepCopyObject().(client.Object)
	now := s.now()
	t.SetDeletionTimestamp(&now)
	t.SetResourceVersion(s.nextRV())
	s.objs[gvk][key] = t
	return nil
}

func (s *Store) Scheme() *runtime.Scheme     { return s.scheme }
func (s *Store) RESTMapper() meta.RESTMapper { return s.mapper }
func (s *Store) GroupVersionKindFor(obj runtime.Object) (schema.GroupVersionKind, error) {
	return s.gvk(obj), nil
}
func (s *Store) IsObjectNamespaced(obj runtime.Object) (bool, error) {
	return apiutil.IsObjectNamespaced(obj, s.scheme, s.mapper)
}

// applyJSONPatch applies a JSON patch (RFC 6902) as the API server does:
// with the same library semantics (a test for null passes on an absent
// member), a failed test or a missing path answered as the API server
// answers it (422 Invalid, a generic message, no causes), and status left as
// stored (the main resource's endpoint ignores status changes). The caller
// holds s.mu.
func (s *Store) applyJSONPatch(gvk schema.GroupVersionKind, stored client.Object, data []byte, obj client.Object, manager string) error {
	p, err := jsonpatch.DecodePatch(data)
	if err != nil {
		return apierrors.NewBadRequest(err.Error())
	}
	current, err := json.Marshal(stored)
	if err != nil {
		return err
	}
	patched, err := p.Apply(current)
	if err != nil {
		return apierrors.NewGenericServerResponse(422, "", schema.GroupResource{}, "", err.Error(), 0, false)
	}
	t, err := s.scheme.New(gvk)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(patched, t); err != nil {
		return err
	}
	if st := reflect.ValueOf(stored).Elem().FieldByName("Status"); st.IsValid() {
		reflect.ValueOf(t).Elem().FieldByName("Status").Set(st)
	}
	s.touch(t.(client.Object), manager)
	return s.put(gvk, stored, t.(client.Object), obj)
}
