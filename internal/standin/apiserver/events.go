package apiserver

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// NodeEventMessages returns the messages of the events of reason on Node
// node, in the default namespace, where node events are recorded.
func NodeEventMessages(ctx context.Context, client kubernetes.Interface, node, reason string) ([]string, error) {
	list, err := client.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, ev := range list.Items {
		if ev.Reason == reason && ev.InvolvedObject.Kind == "Node" && ev.InvolvedObject.Name == node {
			out = append(out, ev.Message)
		}
	}
	return out, nil
}
